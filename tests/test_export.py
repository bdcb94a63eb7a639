"""Slim export of task sub-networks: plain torch modules only, equal outputs, measured FLOPs
equal to the analytic count, residual channels removed together."""

from __future__ import annotations

import json
import subprocess
import sys
import weakref

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from espn.api.experiment import build_benchmark
from espn.cli.main import app
from espn.evaluation.metrics import task_logits
from espn.export.export import export_task, exported, onnx_available
from espn.export.slim import ExportError, fold_batchnorm, plain_copy, slim_copy
from espn.layers.linear import MaskedLinear
from espn.models.convert_checks import random_units
from espn.models.fc import FCNet, fc1024
from espn.models.registry import ModelSpec
from espn.runs.loading import load_run
from espn.supernet import (
    Supernet,
    TaskHead,
    UnitGate,
)
from espn.supernet.layers import MaskedLayer
from helpers.deploy import TinyResNet, train_tiny

runner = CliRunner()


def random_task(sn: Supernet, n_classes: int, x: torch.Tensor, gen: torch.Generator) -> None:
    """Commit a task with random weights, gates/BN statistics, unit and weight masks."""
    sn.begin_task(n_classes)
    with torch.no_grad():
        for layer in sn.layers.values():
            w = layer.weight
            fresh = torch.randn(w.shape, generator=gen) * (2.0 / w[0].numel()) ** 0.5
            w.copy_(torch.where(layer.frozen, w, fresh))
        for m in sn.task_modules.values():
            for name, p in m.named_parameters():
                centre = 1.0 if name == "weight" and not isinstance(m, TaskHead) else 0.0
                p.copy_(centre + 0.2 * torch.randn(p.shape, generator=gen))
        sn.train()
        for _ in range(3):
            sn.forward_working(x)
    sn.set_unit_masks(random_units(sn.group_sizes, gen))
    sn.set_weight_masks(
        {n: torch.rand(m.weight.shape, generator=gen) < 0.6 for n, m in sn.layers.items()}
    )
    sn.eval()
    sn.commit_task()


def flops_of(model: nn.Module, x: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    return counter.get_total_flops()


def build(kind: str) -> tuple[Supernet, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    if kind == "tinyres":
        model, x = TinyResNet(), torch.randn(16, 1, 8, 8, generator=gen)
        n_classes = [3, 5]
    elif kind == "fc1024":
        # --task-affine: gates with a shift and a per-task head bias, all folded on export
        model = fc1024(ModelSpec((1, 28, 28), 10, multi_head=False, task_affine=True))
        x, n_classes = torch.randn(16, 1, 28, 28, generator=gen), [10, 10]
    else:
        model, x = FCNet(64, [32, 24], 4, multi_head=True), torch.randn(16, 1, 8, 8, generator=gen)
        n_classes = [4, 2]
    torch.manual_seed(0)
    sn = Supernet(model, x[:2])
    for n in n_classes:
        random_task(sn, n, x, gen)
    return sn, x


@pytest.mark.parametrize("kind", ["fc1024", "fc-multihead", "tinyres"])
def test_slim_copy_equals_supernet_and_counts_analytic_flops(kind):
    sn, x = build(kind)
    sn.use_task(1)
    for t in range(len(sn.masks)):
        with torch.no_grad():
            want = sn(x, task=t)
        plain = plain_copy(sn, t)
        slim = slim_copy(sn, t, x[:2])
        assert sn.active_task == t  # left on the task, so flops() counts its head
        for model in (plain, slim):
            assert not model.training
            program = exported(model, x[:2]).module()
            assert all(type(m).__module__.split(".")[0] != "espn" for m in program.modules())
            with torch.no_grad():
                got = model(x)
            assert got.shape == want.shape
            assert (got - want).abs().max().item() <= 1e-5
        units = sn.masks[t].units
        assert flops_of(slim, x[:1]) == sn.flops(units)
        alive = sum(int(a.sum()) for a in units.values())
        assert alive < sum(sn.group_sizes.values())
        n_slim = sum(p.numel() for p in slim.parameters())
        assert n_slim < sum(p.numel() for p in plain.parameters())


@pytest.mark.parametrize("kind", ["fc1024", "fc-multihead", "tinyres"])
def test_every_layer_holds_its_masked_weight_at_its_alive_units(kind):
    """Each layer of the slim copy has the shape of its masked weight at the rows and columns
    of its alive units, and is that weight bit for bit where no gate is folded in (a gate
    scales its rows)."""
    sn, x = build(kind)
    for t in range(len(sn.masks)):
        slim = slim_copy(sn, t, x[:2])
        units = sn.masks[t].units
        for name, layer in sn.layers.items():
            w = layer.masked_weight()
            for dim, group, size in (
                (0, layer.out_units, layer.out_unit_size),
                (1, layer.in_units, layer.in_unit_size),
            ):
                if group is not None:
                    w = w[(slice(None),) * dim + (units[group].repeat_interleave(size),)]
            got = slim.get_submodule(name)
            got = got[-1] if isinstance(got, nn.Sequential) else got
            if not any(isinstance(m, UnitGate) for m in sn.model.modules()):
                assert torch.equal(got.weight, w)
            assert got.weight.shape == w.shape


def test_a_model_with_convolutions_or_a_residual_stream_is_cut_by_the_same_swap():
    """tinyres (convolutions, BatchNorm, a residual stream) is cut by the same module swap as
    an MLP: no espn module is left in its slim copy."""
    sn, x = build("tinyres")
    slim = slim_copy(sn, 0, x[:2])
    assert not any(type(m).__module__.startswith("espn.supernet") for m in slim.modules())


def test_residual_channels_are_removed_together():
    sn, x = build("tinyres")
    for t in range(2):
        slim = slim_copy(sn, t, x[:2])
        alive = {g: int(a.sum()) for g, a in sn.masks[t].units.items()}
        assert slim.conv0.out_channels == slim.conv2.out_channels == alive["stream"]
        assert slim.bn0.num_features == slim.bn2.num_features == alive["stream"]
        assert slim.conv1.in_channels == slim.conv3.in_channels == alive["stream"]
        assert slim.conv1.out_channels == slim.bn1.num_features == alive["inner"]
        assert slim.head.in_features == alive["down"]
        assert slim.head.out_features == sn.masks[t].n_classes


def test_gates_and_task_bias_are_folded():
    sn, _ = build("fc1024")
    plain = plain_copy(sn, 0)
    kinds = {type(m) for m in plain.modules()}
    assert nn.Linear in kinds
    assert not kinds & {MaskedLinear, UnitGate, TaskHead}
    linears = [m for m in plain.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 3 and all(m.bias is not None for m in linears)
    # the folded bias of the shared head is the task's own output bias
    assert torch.equal(linears[-1].bias, sn.masks[0].state["head.1.bias"])


def test_unknown_task_is_refused():
    sn, x = build("fc-multihead")
    with pytest.raises(ExportError, match=r"task 5 is not learned \(tasks 0..1\)"):
        slim_copy(sn, 5, x[:2])


def test_gate_that_cannot_be_folded_is_refused():
    class GateFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_in = UnitGate(4, "in")
            self.fc = MaskedLinear(4, 3, in_units="in")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.gate_in(x))

    x = torch.randn(4, 4)
    sn = Supernet(GateFirst(), x)
    sn.begin_task(3)
    sn.commit_task()
    with pytest.raises(
        ExportError, match="must directly follow a linear or conv layer called once"
    ):
        plain_copy(sn, 0)


# ------------------------------------------------------------- export to a file
NO_ESPN_LOADER = """
import json, sys
sys.modules["espn"] = None  # any import of espn fails
import torch
from safetensors.torch import load_file
from torch.utils.flop_counter import FlopCounterMode
model = torch.export.load(sys.argv[1]).module()
data = load_file(sys.argv[2])
with torch.no_grad():
    out = model(data["inputs"])
    counter = FlopCounterMode(display=False)
    with counter:
        model(data["inputs"][:1])
print(json.dumps({"diff": float((out - data["expected"]).abs().max()),
                  "shape": list(out.shape), "flops": counter.get_total_flops()}))
"""


def load_without_espn(tmp_path, model_file, inputs, expected) -> dict:
    """Run an exported model in a fresh interpreter where espn cannot be imported."""
    from safetensors.torch import save_file

    data = tmp_path / "check.safetensors"
    save_file({"inputs": inputs.contiguous(), "expected": expected.contiguous()}, str(data))
    script = tmp_path / "load.py"
    script.write_text(NO_ESPN_LOADER)
    done = subprocess.run(
        [sys.executable, str(script), str(model_file), str(data)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["fc", "conv"])
def test_export_task_writes_a_checked_standalone_model(tmp_path, kind):
    sn, seq, _ = train_tiny(kind)
    task = 1
    x = seq.tasks[task].test.x
    report = export_task(sn, task, [x], tmp_path / "model.pt2", also_onnx=False)
    assert report.files == [str(tmp_path / "model.pt2")]
    assert report.flops == sn.flops(sn.masks[task].units)
    assert report.max_abs_diff <= 1e-5
    with torch.no_grad():
        expected = sn(x, task=task)
    found = load_without_espn(tmp_path, tmp_path / "model.pt2", x, expected)
    assert found["diff"] <= 1e-5
    assert found["shape"] == [len(x), sn.masks[task].n_classes]
    assert found["flops"] == report.flops
    saved = json.loads((tmp_path / "model.json").read_text())
    assert saved["flops"] == report.flops and saved["task"] == task


def test_tolerance_is_absolute_for_small_outputs_and_relative_for_large_ones(tmp_path):
    sn, seq, _ = train_tiny("fc")
    x = seq.tasks[1].test.x
    tiny = export_task(sn, 1, [x * 1e-4], tmp_path / "tiny.pt2", also_onnx=False)
    assert tiny.max_abs_output < 1 and tiny.tolerance == 1e-5
    assert tiny.max_abs_diff <= 1e-5
    # logits in the hundreds: float32 rounding of the folded gates grows with them
    large = export_task(sn, 1, [x * 100.0], tmp_path / "large.pt2", also_onnx=False)
    assert large.max_abs_output > 100
    assert large.tolerance == pytest.approx(1e-5 * large.max_abs_output)
    assert large.max_abs_diff <= large.tolerance


def test_output_check_runs_in_full_float32_and_restores_the_settings(tmp_path, monkeypatch):
    """On a GPU, cuDNN convolutions default to TF32, whose rounding alone exceeds the
    tolerance: the supernet and the slim model are compared in IEEE float32, and the user's
    TF32 settings are as they were afterwards, also when the check fails."""
    sn, seq, _ = train_tiny("conv", n_tasks=1)
    backends = (torch.backends.cudnn.conv, torch.backends.cuda.matmul)
    # torch's backend modules answer these attributes through __getattr__, which pytest's
    # monkeypatch may not see as set: the user's values are restored by hand
    users = [b.fp32_precision for b in backends]
    seen = []
    forward = type(sn).forward

    def spying(self, x, task):
        seen.append([b.fp32_precision for b in backends])
        return forward(self, x, task=task)

    monkeypatch.setattr(type(sn), "forward", spying)
    x = seq.tasks[0].test.x
    try:
        for b in backends:
            b.fp32_precision = "tf32"
        export_task(sn, 0, [x], tmp_path / "m.pt2", also_onnx=False)
        assert seen and all(s == ["ieee", "ieee"] for s in seen)
        assert [b.fp32_precision for b in backends] == ["tf32", "tf32"]
        with pytest.raises(ExportError, match="differs from the supernet"):
            export_task(sn, 0, [x + torch.inf], tmp_path / "bad.pt2", also_onnx=False)
        assert [b.fp32_precision for b in backends] == ["tf32", "tf32"]
    finally:
        for b, value in zip(backends, users, strict=True):
            b.fp32_precision = value


@pytest.mark.skipif(not onnx_available(), reason="onnx/onnxscript not installed")
def test_export_to_onnx(tmp_path):
    import onnx

    sn, seq, _ = train_tiny("conv", n_tasks=1)
    report = export_task(sn, 0, [seq.tasks[0].test.x], tmp_path / "m.pt2", also_onnx=True)
    assert report.files == [str(tmp_path / "m.pt2"), str(tmp_path / "m.onnx")]
    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    assert [i.name for i in graph.input] == ["input"]
    dims = graph.input[0].type.tensor_type.shape.dim
    assert not dims[0].HasField("dim_value")  # dynamic batch
    assert [d.dim_value for d in dims[1:]] == [1, 8, 8]
    convs = {n.input[1]: n for n in graph.node if n.op_type == "Conv"}
    assert len(convs) == 4
    widths = {i.name: list(i.dims) for i in graph.initializer}
    alive = {g: int(a.sum()) for g, a in sn.masks[0].units.items()}
    assert sorted(widths[name][0] for name in convs) == sorted(
        [alive["stream"], alive["inner"], alive["stream"], alive["down"]]
    )


def test_export_refuses_unknown_formats(tmp_path):
    sn, seq, _ = train_tiny("fc", n_tasks=1)
    with pytest.raises(ExportError, match=r"use a file name ending in \.pt2 or \.onnx"):
        export_task(sn, 0, [seq.tasks[0].test.x], tmp_path / "m.pt")


def test_cli_export_matches_supernet_and_results_flops(cli_run, tmp_path):
    target = tmp_path / "task2.pt2"
    result = runner.invoke(
        app, ["export", "--run", str(cli_run), "--task", "2", "--out", str(target)]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((cli_run / "results.json").read_text())
    loaded = load_run(cli_run)
    seq = build_benchmark(loaded.config)
    x = torch.cat(seq.tasks[2].raw_inputs("test", 1024))  # the program takes raw images
    expected = task_logits(loaded.supernet, seq.tasks[2], 2)
    found = load_without_espn(tmp_path, target, x, expected)
    assert found["diff"] <= 1e-5
    assert found["flops"] == doc["flops"][2]
    assert doc["flops_ratio"][2] <= doc["gamma"]
    assert (tmp_path / "task2.onnx").exists() == onnx_available()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "3"], "task 3 is not in the checkpoint; it holds tasks 0..2"),
        (["--task", "-1"], "task -1 is not in the checkpoint; it holds tasks 0..2"),
        (["--task", "0", "--out", "m.pt"], "use a file name ending in .pt2 or .onnx"),
    ],
)
def test_cli_export_rejects_bad_input(cli_run, tmp_path, args, message):
    argv = ["export", "--run", str(cli_run), "--out", str(tmp_path / "m.pt2"), *args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_fold_batchnorm_keeps_outputs_and_flops():
    sn, x = build("tinyres")
    for t in range(2):
        slim = slim_copy(sn, t, x[:2])
        with torch.no_grad():
            before = slim(x)
        folded = fold_batchnorm(slim, x[:2])
        assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
        assert all(m.bias is not None for m in folded.modules() if isinstance(m, nn.Conv2d))
        with torch.no_grad():
            assert (folded(x) - before).abs().max().item() <= 1e-5
            assert (folded(x) - sn(x, task=t)).abs().max().item() <= 1e-5
        assert flops_of(folded, x[:1]) == sn.flops(sn.masks[t].units)


@pytest.mark.slow  # an ONNX export: 10-30 s on a CPU
def test_an_export_captures_the_model_once_for_the_pt2_and_the_onnx_file(tmp_path, monkeypatch):
    """The ``.pt2`` file and the ONNX file are written from one ``torch.export`` capture (the
    ONNX exporter is handed the program), not two."""
    if not onnx_available():
        pytest.skip("ONNX export is not installed")
    sn, seq, _ = train_tiny("fc", n_tasks=1)
    captures = []
    capture = torch.export.export

    def counted(*args, **kwargs):
        captures.append(args[0])
        return capture(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)
    report = export_task(sn, 0, [seq.tasks[0].test.x], tmp_path / "t0.pt2", True)
    assert report.files == [str(tmp_path / "t0.pt2"), str(tmp_path / "t0.onnx")]
    assert len(captures) == 1


class Allocations(TorchDispatchMode):
    """The most bytes held at once in storages that the tensor operations run inside create
    (an in-place operation or a view uses its input's storage: not counted); a storage
    stops counting once freed."""

    def __init__(self) -> None:
        super().__init__()
        self.held = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                storage = t.untyped_storage()
                self.held += storage.nbytes()
                self.peak = max(self.peak, self.held)
                weakref.finalize(storage, self.freed, storage.nbytes())
        return out

    def freed(self, nbytes: int) -> None:
        self.held -= nbytes


def test_a_slim_copy_holds_its_kept_slices_and_never_a_copy_of_the_supernet():
    """slim_copy keeps the kept slices of the layers (counted here from the task's alive
    units) and, while it works, at most one full-width copy of them (run once to record the
    reshapes, freed before the slim copy is cut): never a copy of the whole supernet (its
    weights, masks and frozen sets), which a deep copy of its model would be."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 1, 8, 8, generator=gen)
    torch.manual_seed(0)
    sn = Supernet(FCNet(64, [128] * 16, 4, multi_head=True), x[:2])
    random_task(sn, 4, x, gen)
    units = sn.masks[0].units
    full = kept = 0
    for m in sn.model.modules():
        if isinstance(m, MaskedLayer | TaskHead):
            rows = m.weight.shape[0] if isinstance(m, TaskHead) else int(units[m.out_units].sum())
            cols = int(units[m.in_units].sum()) if m.in_units else m.weight.shape[1]
            bias = 0 if m.bias is None else 1
            full += m.weight.numel() + bias * m.weight.shape[0]
            kept += rows * cols + bias * rows
    with Allocations() as allocated:
        slim = slim_copy(sn, 0, x[:2])
    assert sum(p.numel() for p in slim.parameters()) == kept < full / 3
    assert 4 * kept <= allocated.held <= 4 * kept * 1.02  # the copy's own tensors
    assert allocated.peak - allocated.held <= 4 * full * 1.1  # its work: one full-width pass
    supernet = {t.untyped_storage().data_ptr() for t in (*sn.parameters(), *sn.buffers())}
    assert not any(
        t.untyped_storage().data_ptr() in supernet for t in (*slim.parameters(), *slim.buffers())
    )
