"""The compatibility matrix: which networks espn takes, end to end, as a new user brings them.

Every classification builder of ``torchvision.models.list_models(module=torchvision.models)``
(``weights=None``), the timm families researchers use most at small configurations, and
hand-written research-style models, each with 4 classes at a small input (32x32 where the model
accepts it, else the smallest of :data:`SIZES` it runs at), goes through:

1. ``espn.wrap`` (an ``EspnError`` here is the verdict *refused*, with espn's one-line reason);
2. ESPN at gamma 0.5 for 2 tiny synthetic tasks (64 training samples each, one pass a phase),
   or, for a model no sub-network of which costs that little, at the smallest FLOPs ratio it
   can reach rounded up (plus 0.01), named in the row's notes;
3. task 0's logits after task 1, bit for bit against those before it (else *broken: forgetting*);
4. the export of each task (``.pt2``), run at batch 1 and 3 against its outputs at the checked
   batch (a shape of the example baked in fails here);
5. the FLOPs check: ``FlopCounterMode`` on each loaded program (batch 1) over ``FlopCounterMode``
   on the model as given (see :func:`flops`) must equal the ratio ``learner.report()`` gives
   within 1% (else *broken: flops*);
6. task 0's export against the model as given, median seconds at batch 1 and 64 (the speed-up).

An export whose outputs at batch 1 and 3 differ from those at the checked batch is *broken: batch
size*; any other exception, or an ``EspnError`` after ``wrap``, is *broken: error* (naming the stage);
a process that dies is *broken: crash*; one past ``--timeout`` is *timeout*. Each model runs in
its own process; results go to a JSON file (written atomically after each model) that a rerun
resumes from, and ``--docs`` writes the table into a page between the markers
``<!-- model-matrix:start -->`` and ``<!-- model-matrix:end -->``.

    python benchmarks/model_matrix.py --docs docs/models.md            # everything (hours)
    python benchmarks/model_matrix.py --family hand,timm --jobs 2
    python benchmarks/model_matrix.py --only torchvision/resnet18 --redo
    python benchmarks/model_matrix.py --table-only --docs docs/models.md
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

#: input sizes tried in turn for a torchvision builder, the smallest that runs is used
SIZES = (32, 64, 96, 128, 160, 224, 299)
CLASSES = 4
START, END = "<!-- model-matrix:start -->", "<!-- model-matrix:end -->"
VERDICTS = ("works", "refused", "broken", "timeout", "skipped")


@dataclass
class Entry:
    """One model of the matrix: ``build()`` returns the model and an example batch of 2."""

    name: str
    family: str
    build: Callable[[], tuple[nn.Module, Tensor]]
    note: str = ""


# ---------------------------------------------------------------- hand-written models
class Attention(nn.Module):
    """Multi-head self-attention as research code writes it (shapes read from ``x.shape``)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        x = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(x)


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class HandViT(nn.Module):
    """A ViT with a bare class token and position embedding, ``len(x)`` in forward;
    ``pool``: ``"cls"`` (the class token) or ``"mean"`` (the mean of all tokens)."""

    def __init__(self, pool: str = "cls", dim: int = 64, depth: int = 2, patch: int = 4) -> None:
        super().__init__()
        self.pool = pool
        self.to_patches = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(0.02 * torch.randn(1, (32 // patch) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*(Block(dim, 4) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.to_patches(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(len(x), -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embedding[:, : x.shape[1] + 1]
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1) if self.pool == "mean" else x[:, 0])


class PreActBlock(nn.Module):
    """A pre-activation residual block with functional ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.shortcut = (
            nn.Conv2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout else None
        )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(x))
        skip = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + skip


class PreActResNet(nn.Module):
    """A small pre-activation ResNet (one block a stage, widths 16, 32, 64)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.layers = nn.Sequential(
            PreActBlock(16, 16, 1), PreActBlock(16, 32, 2), PreActBlock(32, 64, 2)
        )
        self.bn = nn.BatchNorm2d(64)
        self.linear = nn.Linear(64, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn(self.layers(self.conv1(x))))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))


class MixerBlock(nn.Module):
    """Token mixing (a Linear over the token axis), then channel mixing."""

    def __init__(self, tokens: int, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.tokens = nn.Sequential(
            nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens)
        )
        self.channels = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class Mixer(nn.Module):
    """A small MLP-Mixer: 4x4 patches, 2 blocks, mean pooling."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, 4)
        self.blocks = nn.Sequential(MixerBlock(64, dim), MixerBlock(64, dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(self.stem(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(x).mean(dim=1))


class CNN1d(nn.Module):
    """A 1-D CNN over 3-channel signals of length 64."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(3, 16, 5, padding=2),
            nn.BatchNorm1d(16),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(16, 32, 5, padding=2),
            nn.BatchNorm1d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool1d(1),
        )
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x).flatten(1))


class TokenNet(nn.Module):
    """Token ids (int64, length 32, vocabulary 64) into an embedding, mean-pooled, an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, ids: Tensor) -> Tensor:
        return self.mlp(self.embed(ids).mean(dim=1))


# ---------------------------------------------------------------- the list
def _image(size: int) -> Tensor:
    return torch.zeros(2, 3, size, size)


def _hand(name: str, make: Callable[[], nn.Module], example: Tensor, note: str) -> Entry:
    return Entry(f"hand/{name}", "hand", lambda: (make(), example), note)


def hand_entries() -> list[Entry]:
    return [
        _hand("vit-cls", HandViT, _image(32), "class token, position embedding, len(x)"),
        _hand("vit-mean", lambda: HandViT("mean"), _image(32), "as vit-cls, mean of the tokens"),
        _hand("preact-resnet", PreActResNet, _image(32), "functional ReLU"),
        _hand("mlp-mixer", Mixer, _image(32), "token-mixing Linear"),
        _hand("cnn1d", CNN1d, torch.zeros(2, 3, 64), "Conv1d, input 3x64"),
        _hand("token-embedding", TokenNet, torch.zeros(2, 32, dtype=torch.long), "int64 ids"),
    ]


def _runs(model: nn.Module, x: Tensor) -> bool:
    model.eval()
    try:
        with torch.no_grad():
            model(x)
    except Exception:  # the model does not accept this input size: try the next
        return False
    return True


def _torchvision(name: str) -> tuple[nn.Module, Tensor]:
    import torchvision

    for size in SIZES:
        kwargs: dict[str, Any] = {"weights": None, "num_classes": CLASSES}
        if name.startswith("vit_"):  # a multiple of the patch: vit_h_14 at 28, not 224
            size -= size % int(name.rsplit("_", 1)[1])
            kwargs["image_size"] = size
        if name == "maxvit_t":
            kwargs["input_size"] = (size, size)
        if name in ("googlenet", "inception_v3"):
            kwargs |= {"aux_logits": False, "init_weights": True}
        torch.manual_seed(0)
        try:
            model = torchvision.models.get_model(name, **kwargs)
        except Exception:
            continue
        if _runs(model, _image(size)):
            return model, _image(size)
    raise ValueError(f"runs at none of the sizes {SIZES}")


def torchvision_entries() -> list[Entry]:
    import torchvision

    notes = {
        "googlenet": "aux_logits=False",
        "inception_v3": "aux_logits=False",
        "maxvit_t": "input_size set",
        "vit_h_14": "image_size 28 (a multiple of its patch)",
    }
    return [
        Entry(f"torchvision/{n}", "torchvision", lambda n=n: _torchvision(n), notes.get(n, ""))
        for n in torchvision.models.list_models(module=torchvision.models)
    ]


#: timm models at small configurations (32x32 inputs): name, model, creation arguments
TIMM: list[tuple[str, str, dict[str, Any]]] = [
    ("resnet18", "resnet18", {}),
    ("resnet18d", "resnet18d", {}),
    ("efficientnet_b0", "efficientnet_b0", {}),
    ("mobilenetv3_small_050", "mobilenetv3_small_050", {}),
    ("mobilenetv3_large_100", "mobilenetv3_large_100", {}),
    ("regnetx_002", "regnetx_002", {}),
    ("regnety_002", "regnety_002", {}),
    ("convnext_atto", "convnext_atto", {}),
    ("vit_tiny", "vit_tiny_patch16_224", {"img_size": 32, "patch_size": 4, "depth": 2}),
    (
        "vit_tiny-avg",
        "vit_tiny_patch16_224",
        {"img_size": 32, "patch_size": 4, "depth": 2, "global_pool": "avg"},
    ),
    ("deit_tiny", "deit_tiny_patch16_224", {"img_size": 32, "patch_size": 4, "depth": 2}),
    (
        "deit_tiny_distilled",
        "deit_tiny_distilled_patch16_224",
        {"img_size": 32, "patch_size": 4, "depth": 2},
    ),
    (
        "swin_tiny",
        "swin_tiny_patch4_window7_224",
        {"img_size": 32, "window_size": 4, "depths": (2, 2, 2, 2)},
    ),
    ("mobilevit_xxs", "mobilevit_xxs", {}),
    ("mobilevitv2_050", "mobilevitv2_050", {}),
    ("resnetv2_50x1_bit", "resnetv2_50x1_bit", {}),
    ("mixer_s16", "mixer_s16_224", {"img_size": 32}),
]


def _timm(model_name: str, kwargs: dict[str, Any]) -> tuple[nn.Module, Tensor]:
    import timm

    torch.manual_seed(0)
    model = timm.create_model(model_name, pretrained=False, num_classes=CLASSES, **kwargs)
    return model, _image(32)


def timm_entries() -> list[Entry]:
    def note(model_name: str, kwargs: dict[str, Any]) -> str:
        return ", ".join([model_name] + [f"{k}={v}" for k, v in kwargs.items()])

    return [
        Entry(f"timm/{n}", "timm", lambda m=m, k=k: _timm(m, k), note(m, k)) for n, m, k in TIMM
    ]


def entries() -> list[Entry]:
    """Every model of the matrix, in table order."""
    return hand_entries() + timm_entries() + torchvision_entries()


# ---------------------------------------------------------------- one model
def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    return text if len(text) <= 300 else text[:297] + "..."


def _cpu_attention(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
    return int(sdpa_flop_count(q, k, v))


def flops(model: nn.Module, x: Tensor) -> int:
    """``FlopCounterMode``'s count of one sample through ``model``, with torch's own formula for
    ``scaled_dot_product_attention`` applied to its CPU kernel too (``FlopCounterMode`` counts
    only the CUDA ones), and gradients on (``nn.MultiheadAttention``'s fused inference path is
    not counted either)."""
    cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    counter = FlopCounterMode(display=False, custom_mapping={cpu: _cpu_attention})
    with counter:
        model(x[:1])
    return int(counter.get_total_flops())


def task_data(example: Tensor, seed: int, n: int) -> tuple[Tensor, Tensor]:
    """``n`` samples of a tiny synthetic task shaped like ``example``: noisy class prototypes
    (token ids: a class shifts half the tokens to its own quarter of the vocabulary)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % CLASSES
    shape = example.shape[1:]
    if example.dtype == torch.long:
        ids = torch.randint(64, (n, *shape), generator=gen)
        own = y.view(-1, *[1] * len(shape)) * 16 + torch.randint(16, (n, *shape), generator=gen)
        return torch.where(torch.rand(n, *shape, generator=gen) < 0.5, own, ids), y
    protos = torch.randn(CLASSES, *shape, generator=gen)
    return protos[y] + 0.5 * torch.randn(n, *shape, generator=gen), y


def timed(models: dict[str, Callable[[Tensor], Any]], x: Tensor) -> dict[str, float]:
    """Median seconds per call of each model on ``x`` (see ``inference_speed``)."""
    from inference_speed import interleaved_medians  # benchmarks/, beside this script

    return interleaved_medians(models, x, repeats=5, block=0.05)


@dataclass
class Settings:
    """How each model is learned and measured."""

    per_task: int = 64
    batch_size: int = 32
    gamma: float = 0.5
    timing_batches: list[int] = field(default_factory=lambda: [1, 64])
    max_params: int | None = None


def check(entry: Entry, settings: Settings) -> dict[str, Any]:
    """Run ``entry`` through wrap, 2 tasks, the forgetting check, export and the FLOPs check;
    the result row (``verdict`` one of :data:`VERDICTS`)."""
    import espn
    from espn.errors import EspnError
    from espn.export.export import load_exported

    row: dict[str, Any] = {"name": entry.name, "family": entry.family, "note": entry.note}
    started = time.perf_counter()
    stage = "build"

    def done(verdict: str, **more: Any) -> dict[str, Any]:
        return row | {"verdict": verdict, "seconds": round(time.perf_counter() - started, 1)} | more

    try:
        model, x = entry.build()
    except Exception as exc:
        return done("skipped", stage=stage, reason=f"cannot be built here: {one_line(exc)}")
    row["input"] = list(x.shape[1:])
    row["dtype"] = str(x.dtype).removeprefix("torch.")
    row["parameters"] = sum(p.numel() for p in model.parameters())
    if settings.max_params is not None and row["parameters"] > settings.max_params:
        reason = f"{row['parameters']:,} parameters, over --max-params {settings.max_params:,}"
        return done("skipped", stage=stage, reason=reason)
    try:
        stage = "dense FLOPs"
        model.eval()
        row["dense_flops"] = flops(model, x)
        stage = "wrap"
        try:
            sn = espn.wrap(model, x)
        except EspnError as exc:
            return done("refused", stage=stage, reason=one_line(exc))
        del model  # wrap copied it: built again for the timing, not held through the training
        gamma = max(settings.gamma, math.ceil(sn.floor_ratio() * 100) / 100 + 0.01)
        if gamma > settings.gamma:  # checked at the cheapest budget it can reach, and said so
            row["gamma"] = gamma
            row["note"] = "; ".join(
                filter(
                    None,
                    [
                        row["note"],
                        f"gamma {gamma:g}: the cheapest it can be is {sn.floor_ratio():.3f}",
                    ],
                )
            )
        learner = espn.ContinualLearner(
            sn,
            "espn",
            gamma=gamma,
            epochs=(1, 1, 1),
            optimizer="sgd",
            lr=0.01,
            momentum=0.9,
            batch_size=settings.batch_size,
            seed=0,
        )
        data = [
            (task_data(x, 2 * t, settings.per_task), task_data(x, 2 * t + 1, 24)) for t in range(2)
        ]
        stage = "learn task 0"
        learner.learn(data[0][0], test=data[0][1])
        probe = data[0][1][0]
        sn.eval()
        with torch.no_grad():
            before = sn(probe, task=0)
        stage = "learn task 1"
        learner.learn(data[1][0], test=data[1][1])
        sn.eval()
        with torch.no_grad():
            after = sn(probe, task=0)
        if not torch.equal(before, after):
            diff = float((before - after).abs().max())
            return done(
                "broken",
                problem="forgetting",
                stage="task 0 after task 1",
                reason=f"task 0's logits changed by up to {diff:.3g}",
            )
        tasks, mismatch = [], None
        with tempfile.TemporaryDirectory() as tmp:
            for t, record in enumerate(learner.report()):
                stage = f"export task {t}"
                report = learner.export(t, Path(tmp) / f"task{t}.pt2", onnx=False)
                program = load_exported(report.files[0])
                measured = flops(program, data[t][1][0])
                ratio = measured / row["dense_flops"]
                reported = float(record["flops_ratio"])
                tasks.append(
                    {
                        "reported_ratio": reported,
                        "measured_ratio": ratio,
                        "reported_flops": float(record["flops"]),
                        "measured_flops": measured,
                    }
                )
                if mismatch is None and abs(ratio - reported) > 0.01 * max(reported, 1e-12):
                    mismatch = (
                        f"task {t}: reported FLOPs ratio {reported:.3f}, the export measures "
                        f"{ratio:.3f} of the dense model"
                    )
                stage = f"export task {t} at batch 1 and 3"
                xs = data[t][1][0]
                with torch.no_grad():
                    whole = program(xs)
                    parts = torch.cat([program(xs[:1]), program(xs[1:4])])
                # float32 convs sum in another order at another batch size: a deep network's
                # logits move by ~1e-5 of their scale (inception_v3), a baked-in shape far more
                scale = max(1.0, float(whole.abs().max()))
                if not torch.allclose(parts, whole[:4], rtol=1e-4, atol=1e-4 * scale):
                    return done(
                        "broken",
                        problem="batch size",
                        stage=stage,
                        tasks=tasks,
                        reason="the export's outputs depend on the batch size",
                    )
                del program  # not held through the next task's export
            # the model is built again for the timing once the learner is freed: never both
            del learner, sn
            gc.collect()  # the learner's reference cycles
            stage = "timing"
            row["speedup"] = {}
            program = load_exported(Path(tmp) / "task0.pt2")
            dense = entry.build()[0].eval()
            for b in settings.timing_batches:
                xb = task_data(x, 99, b)[0]
                ms = timed({"dense": dense, "export": program}, xb)
                row["speedup"][str(b)] = ms["dense"] / ms["export"]
        row["tasks"] = tasks
        if mismatch is not None:
            return done("broken", problem="flops", stage="FLOPs check", reason=mismatch)
        return done("works")
    except EspnError as exc:
        kind = f"espn refused after wrap ({type(exc).__name__})"
        return done("broken", problem="error", stage=stage, reason=f"{kind}: {one_line(exc)}")
    except Exception as exc:
        return done(
            "broken", problem="error", stage=stage, reason=f"{type(exc).__name__}: {one_line(exc)}"
        )


# ---------------------------------------------------------------- the matrix
def run_child(entry: Entry, args: argparse.Namespace) -> dict[str, Any]:
    """``entry`` checked in its own process, killed after ``args.timeout`` seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        command = [
            sys.executable,
            __file__,
            "--child",
            entry.name,
            "--child-out",
            str(out),
            "--threads",
            str(args.threads),
            "--per-task",
            str(args.per_task),
            "--timing-batches",
            ",".join(map(str, args.timing_batches)),
        ]
        if args.max_params is not None:
            command += ["--max-params", str(args.max_params)]
        base = {"name": entry.name, "family": entry.family, "note": entry.note}
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            reason = f"did not finish in {args.timeout:g} s"
            return base | {"verdict": "timeout", "reason": reason, "seconds": args.timeout}
        if out.is_file():
            return dict(json.loads(out.read_text()))
        lines = done.stderr.strip().splitlines() or ["(no output)"]
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        return base | {
            "verdict": "broken",
            "problem": "crash",
            "reason": f"the process died ({how}): {lines[-1][:300]}",
            "seconds": round(time.perf_counter() - started, 1),
        }


def espn_commit() -> str:
    """The git commit of the espn source imported here (``+dirty`` with local changes), so
    that each row says which code it checked; ``unknown`` outside a git checkout."""
    import espn

    src = Path(espn.__file__).parent
    git = ["git", "-C", str(src)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        dirty = subprocess.run([*git, "status", "--porcelain", "."], capture_output=True, text=True)
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def select(args: argparse.Namespace) -> list[Entry]:
    everything = entries()
    chosen = everything
    if args.family:
        families = set(args.family.split(","))
        unknown = families - {e.family for e in everything}
        if unknown:
            sys.exit(f"--family: unknown {sorted(unknown)}; known: hand, torchvision, timm")
        chosen = [e for e in chosen if e.family in families]
    if args.only:
        names = args.only.split(",")
        known = {e.name for e in everything}
        unknown_names = [n for n in names if n not in known]
        if unknown_names:
            sys.exit(f"--only: unknown {unknown_names}; names look like {everything[0].name}")
        by_name = {e.name: e for e in chosen}
        chosen = [by_name[n] for n in names if n in by_name]  # in the order given
    return chosen


def ratios(row: dict[str, Any]) -> str:
    return "; ".join(
        f"{t['reported_ratio']:.3f} / {t['measured_ratio']:.3f}" for t in row.get("tasks", [])
    )


def table(rows: list[dict[str, Any]], total: int | None = None) -> str:
    """The Markdown table of ``rows``, with a count line on top (``total``: the models of the
    matrix, when only some were checked)."""
    counts = Counter(r["verdict"] for r in rows)
    problems = Counter(r.get("problem") for r in rows if r["verdict"] == "broken")
    broken = ", ".join(f"{n} {p}" for p, n in sorted(problems.items()))
    checked = (
        f"{len(rows)} of {total} models"
        if total not in (None, len(rows))
        else f"{len(rows)} models"
    )
    summary = f"{checked}: " + ", ".join(
        f"{counts[v]} {v}" + (f" ({broken})" if v == "broken" and broken else "")
        for v in VERDICTS
        if counts[v]
    )
    commits = sorted({r["espn"] for r in rows if r.get("espn")})
    if commits:
        summary += f" (espn {', '.join(commits)})"
    lines = [
        summary + ".",
        "",
        "| model | input | verdict | FLOPs ratio, task 0; 1 (reported / measured) "
        "| export speed-up, batch 1 / 64 | reason, notes |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        verdict = r["verdict"] + (f": {r['problem']}" if r.get("problem") else "")
        shape = "x".join(map(str, r.get("input", [])))
        if r.get("dtype") == "int64":
            shape += " int64"
        speed = " / ".join(f"{s:.2f}x" for s in r.get("speedup", {}).values())
        where = f"at {r['stage']}: " if r.get("stage") and r["verdict"] == "broken" else ""
        text = "; ".join(filter(None, [where + r.get("reason", ""), r.get("note", "")]))
        text = text.replace("|", "\\|")
        lines.append(f"| {r['name']} | {shape} | {verdict} | {ratios(r)} | {speed} | {text} |")
    return "\n".join(lines) + "\n"


def write_docs(page: Path, rows: list[dict[str, Any]], total: int) -> None:
    """Replace what lies between the markers of ``page`` with the table, atomically."""
    from espn.utils.io import atomic_target

    text = page.read_text()
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        sys.exit(f"{page}: needs one {START} line and one {END} line after it")
    head, rest = text.split(START)
    tail = rest.split(END)[1]
    with atomic_target(page) as tmp:
        tmp.write_text(f"{head}{START}\n{table(rows, total)}{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated model names, checked in this order")
    parser.add_argument("--family", help="comma-separated: hand, torchvision, timm")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    parser.add_argument("--docs", type=Path, help="a page to write the table into")
    parser.add_argument("--jobs", type=int, default=1, help="models checked at once")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per model")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per model")
    parser.add_argument("--per-task", type=int, default=64, help="training samples per task")
    parser.add_argument("--timing-batches", default="1,64")
    parser.add_argument("--max-params", type=int, help="skip models with more parameters")
    parser.add_argument("--redo", action="store_true", help="check models already in --out again")
    parser.add_argument("--table-only", action="store_true", help="write --docs from --out")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.timing_batches = [int(b) for b in args.timing_batches.split(",") if b]
    torch.set_num_threads(args.threads)
    if args.child:
        from espn.utils.io import write_json_atomic

        (entry,) = [e for e in entries() if e.name == args.child]
        settings = Settings(
            args.per_task, timing_batches=args.timing_batches, max_params=args.max_params
        )
        write_json_atomic(args.child_out, check(entry, settings))
        return
    from espn.utils.io import write_json_atomic

    chosen = select(args)
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results.setdefault("models", {})
    results["versions"] = {
        "torch": torch.__version__,
        **{m: __import__(m).__version__ for m in ("torchvision", "timm")},
    }
    code = espn_commit()
    todo = [e for e in chosen if args.redo or e.name not in results["models"]]
    if not args.table_only:
        print(f"{len(todo)} of {len(chosen)} models to check", flush=True)
        lock = threading.Lock()

        def one(entry: Entry) -> None:
            row = run_child(entry, args) | {"espn": code}
            with lock:
                results["models"][entry.name] = row
                write_json_atomic(args.out, results)
                what = row["verdict"] + (f" ({row['problem']})" if row.get("problem") else "")
                print(
                    f"{entry.name:<40} {what:<18} {row.get('seconds', 0):>6.0f} s  "
                    f"{ratios(row) or row.get('reason', '')}",
                    flush=True,
                )

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            list(pool.map(one, todo))
    order = [e.name for e in entries()]
    rows = sorted(
        results["models"].values(),
        key=lambda r: order.index(r["name"]) if r["name"] in order else len(order),
    )
    print(table(rows, len(order)).splitlines()[0])
    if args.docs:
        write_docs(args.docs, rows, len(order))


if __name__ == "__main__":
    main()
