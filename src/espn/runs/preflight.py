"""What a run needs of this machine and its file system (device, files), checked before it
starts; :mod:`espn.runs.config` checks values only."""

from __future__ import annotations

from pathlib import Path

import torch

from espn.runs.config import ConfigError, RunConfig


def check_device(device: str) -> None:
    """Refuse a CUDA device this machine does not have (the name itself is the config's)."""
    parsed = torch.device(device)
    if parsed.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device: device {device!r}: CUDA is not available here; use --device cpu"
        )
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ConfigError(
            f"device: device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present"
        )


#: said when ``--amp`` is asked of a CPU run
AMP_ON_CPU = (
    "--amp on a CPU autocasts to bfloat16 (float16 with loss scaling is CUDA's): on most CPUs "
    "that is no faster than float32 and less precise; leave --amp out on a CPU"
)


#: said when ``--compile`` is asked of a CPU run
COMPILE_ON_CPU = (
    "--compile on a CPU compiles the step through inductor's C++ backend before the first "
    "step: about 90-130 s for a small FC network's two graphs on a 2-core machine (a 3-task "
    "FC run measured 125.8 s compiled against 7.4 s eager), and again for each new batch "
    "shape; it pays only when the steps it speeds up save more than that, so only for a run "
    "whose eager training takes many times that long, and a CPU step is rarely faster "
    "compiled; leave it out on a CPU, it is meant for a GPU (docs/performance.md)"
)


def run_warnings(cfg: RunConfig) -> list[str]:
    """What a run will do that is rarely meant: ``--amp``/``--compile`` on a CPU."""
    notes = []
    cpu = torch.device(cfg.device).type == "cpu"
    if cfg.amp and cpu:
        notes.append(AMP_ON_CPU)
    if cfg.compile and cpu:
        notes.append(COMPILE_ON_CPU)
    return notes


def check_run(cfg: RunConfig) -> None:
    """What ``cfg`` names beyond its values: the device, the init weights' file and an
    explicit ``data_dir`` (never silently replaced: it must be a directory)."""
    check_device(cfg.device)
    if cfg.init_weights is not None and not Path(cfg.init_weights).is_file():
        raise ConfigError(
            f"init_weights: init_weights: no file {cfg.init_weights} "
            "(give a .safetensors or .pt file)"
        )
    path = cfg.data_dir
    if path is not None and not Path(path).is_dir():
        what = "is a file" if Path(path).exists() else "does not exist"
        raise ConfigError(
            f"data_dir {path} {what}; give an existing dataset directory, or leave "
            "--data-dir out to use $ESPN_DATA or ~/.cache/espn/data"
        )
