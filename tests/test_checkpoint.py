"""The run checkpoint: exact round trip, atomic writes, and refusal of anything broken."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import espn.checkpoint.store as store_module
from espn.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    CheckpointWriter,
    read_checkpoint,
    restore,
)
from espn.checkpoint.format import sha256_of
from espn.cli.main import app
from espn.evaluation.metrics import task_logits
from espn.models.fc import FCNet
from espn.runs.resuming import continue_training, scaler_state
from espn.supernet import Supernet, unpack_bits
from espn.training.engine import Engine
from helpers.deploy import make_model, train_tiny

runner = CliRunner()
GROUPS = {"hidden1": 64, "hidden2": 48}  # the unit groups of fc-test (784-64-48-classes)
META = {
    "model": "tiny",
    "benchmark": "tiny",
    "config": {},
    "spec": {"input_shape": [1, 8, 8], "n_classes": 3, "multi_head": True},
}


def fresh_supernet(kind: str, seq, seed: int = 123) -> Supernet:
    """The same architecture with other initial weights."""
    torch.manual_seed(seed)
    return Supernet(make_model(kind), seq.tasks[0].train.x[:2])


def save_run(kind: str, directory: Path):
    sn, seq, engine = train_tiny(kind)
    results = [{"name": t.name, "record": {}, "accuracy": [0.0]} for t in seq.tasks]
    CheckpointWriter(directory, META).save(sn, results, generator=engine.generator)
    return sn, seq, engine


@pytest.fixture(scope="module")
def saved_fc(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ckpt") / "checkpoint"
    sn, seq, _ = save_run("fc", directory)
    return sn, seq, directory


@pytest.mark.parametrize("kind", ["fc", "conv"])
def test_round_trip_reproduces_every_tasks_logits_bit_for_bit(tmp_path, kind):
    sn, seq, _ = save_run(kind, tmp_path / "checkpoint")
    other = fresh_supernet(kind, seq)
    assert not torch.equal(
        other.model.state_dict()[next(iter(sn.layers)) + ".weight"],
        sn.layers[next(iter(sn.layers))].weight,
    )
    restore(read_checkpoint(tmp_path / "checkpoint"), other)
    assert len(other.masks) == len(sn.masks) == 3
    for name, layer in sn.layers.items():
        assert torch.equal(other.layers[name].weight, layer.weight)
        assert torch.equal(other.layers[name].frozen, layer.frozen)
    for t, task in enumerate(seq.tasks):
        assert torch.equal(
            other.masks[t].units["hidden1" if kind == "fc" else "stream"],
            sn.masks[t].units["hidden1" if kind == "fc" else "stream"],
        )
        want = task_logits(sn, task, t)
        got = task_logits(other, task, t)
        assert torch.equal(got, want)


def test_files_are_safetensors_and_json_with_shared_weights_once(saved_fc):
    sn, _, directory = saved_fc
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["format"] == "espn-checkpoint"
    assert manifest["format_version"] == FORMAT_VERSION
    names = sorted(p.name for p in directory.iterdir())
    assert names == ["manifest.json", "state-000001.safetensors"] + [
        f"task-{t:04d}.safetensors" for t in range(3)
    ]
    state = load_file(str(directory / "state-000001.safetensors"))
    shared = [k for k in state if k.startswith("shared.")]
    assert len(shared) == len(sn.layers)
    bits = manifest["owner_bits"]  # 3 tasks: ids 0..2 and the free sentinel 3 in 2 bits
    assert bits == 2
    for name, layer in sn.layers.items():  # one owner id per weight, for all tasks together
        planes = state[f"owner.{name}"]
        n = layer.weight.numel()
        assert planes.dtype == torch.uint8 and planes.numel() == bits * -(-n // 8)
        ids = sum(
            unpack_bits(planes[k * -(-n // 8) : (k + 1) * -(-n // 8)], (n,)).long() << k
            for k in range(bits)
        )
        assert torch.equal(ids.view_as(layer.frozen) != 3, layer.frozen)
        assert torch.equal(
            ids.view_as(layer.frozen), sn.owners.ids[name].long().masked_fill(~layer.frozen, 3)
        )
    for t in range(3):
        task = load_file(str(directory / f"task-{t:04d}.safetensors"))
        assert not any(k.startswith("shared.") for k in task)  # weights are stored once
        forms = manifest["tasks"][t]["masks"]
        assert set(forms) == set(sn.layers)
        stored = {
            k.removeprefix("weights."): v for k, v in task.items() if k.startswith("weights.")
        }
        assert set(stored) == {n for n, f in forms.items() if f in ("bits", "indices")}
        for name, payload in stored.items():  # the smaller of bits and indices
            numel = sn.layers[name].weight.numel()
            nnz = int(sn.masks[t].weight_mask(name).sum())
            assert payload.numel() * payload.element_size() == min(-(-numel // 8), 4 * nnz)
        for g, size in sn.group_sizes.items():  # unit masks: a bit per unit
            assert task[f"units.{g}"].dtype == torch.uint8
            assert task[f"units.{g}"].numel() == -(-size // 8)
        assert manifest["tasks"][t]["sha256"] == sha256_of(directory / f"task-{t:04d}.safetensors")


def corrupt(directory: Path, how: str) -> str:
    """Damage a copy of a checkpoint; return the message expected on loading it."""
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    task1 = directory / "task-0001.safetensors"
    state = directory / manifest["state"]["file"]
    if how == "truncated task file":
        task1.write_bytes(task1.read_bytes()[:-100])
        return "task-0001.safetensors is truncated or corrupted"
    if how == "flipped byte":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
        return "is corrupted (its SHA-256 differs from the manifest's)"
    if how == "missing file":
        task1.unlink()
        return "task-0001.safetensors is missing"
    if how == "truncated manifest":
        manifest_path.write_text(manifest_path.read_text()[:200])
        return "manifest.json is truncated or corrupted (not valid JSON"
    if how == "newer format":
        manifest["format_version"] = FORMAT_VERSION + 1
        manifest_path.write_text(json.dumps(manifest))
        return f"format version {FORMAT_VERSION + 1}, newer than this espn reads"
    if how == "not a checkpoint":
        manifest_path.write_text(json.dumps({"hello": 1}))
        return "is not an espn checkpoint manifest"
    if how == "no manifest":
        manifest_path.unlink()
        return "no checkpoint in"
    raise AssertionError(how)


HOW = [
    "truncated task file",
    "flipped byte",
    "missing file",
    "truncated manifest",
    "newer format",
    "not a checkpoint",
    "no manifest",
]


def copy_dir(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


@pytest.mark.parametrize("how", HOW)
def test_damaged_checkpoint_is_refused(saved_fc, tmp_path, how):
    _, _, directory = saved_fc
    damaged = copy_dir(directory, tmp_path / "checkpoint")
    message = corrupt(damaged, how)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(damaged)
    assert message in str(info.value)


def test_checkpoint_of_another_model_is_refused_and_nothing_is_loaded(saved_fc):
    _, seq, directory = saved_fc
    torch.manual_seed(0)
    other = Supernet(FCNet(64, [32, 20], 3, multi_head=True), seq.tasks[0].train.x[:2])
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(CheckpointError, match="does not fit this tiny supernet") as info:
        restore(read_checkpoint(directory), other)
    assert "layer 'features.3' is [24, 32] in the checkpoint, [20, 32] here" in str(info.value)
    assert other.masks == []
    assert all(torch.equal(before[k], v) for k, v in other.model.state_dict().items())


def test_tensor_that_does_not_fit_is_refused_before_anything_changes(saved_fc, tmp_path):
    """A checkpoint whose hashes are right but whose content is wrong is not half-loaded."""
    _, seq, directory = saved_fc
    damaged = copy_dir(directory, tmp_path / "checkpoint")
    path = damaged / "task-0002.safetensors"
    tensors = load_file(str(path))
    del tensors["units.hidden2"]
    save_file(tensors, str(path))
    manifest = json.loads((damaged / "manifest.json").read_text())
    manifest["tasks"][2] |= {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    other = fresh_supernet("fc", seq)
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(CheckpointError, match="task 2: unit mask of group 'hidden2' missing"):
        restore(read_checkpoint(damaged), other)
    assert other.masks == []
    assert all(torch.equal(before[k], v) for k, v in other.model.state_dict().items())


@pytest.mark.parametrize("fail_at", ["state file", "manifest"])
def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path, monkeypatch, fail_at):
    sn, seq, engine = train_tiny("fc", n_tasks=2)
    results = [{"name": t.name, "record": {}, "accuracy": [0.0]} for t in seq.tasks]
    directory = tmp_path / "checkpoint"
    writer = CheckpointWriter(directory, META)
    one_task = sn.masks[1:]
    sn.masks = sn.masks[:1]
    writer.save(sn, results, generator=engine.generator)  # a checkpoint holding task 0
    sn.masks += one_task

    class Killed(Exception):
        pass

    if fail_at == "state file":
        real = store_module.save_file

        def half_written(tensors, path):
            real(tensors, path)
            Path(path).write_bytes(Path(path).read_bytes()[:1000])
            raise Killed

        monkeypatch.setattr(store_module, "save_file", half_written)
    else:

        def killed(path, data):
            raise Killed

        monkeypatch.setattr(store_module, "write_json_atomic", killed)
    with pytest.raises(Killed):
        writer.save(sn, results, generator=engine.generator)
    ckpt = read_checkpoint(directory)  # the previous one, complete
    assert len(ckpt.masks) == 1
    monkeypatch.undo()
    writer.save(sn, results, generator=engine.generator)
    assert len(read_checkpoint(directory).masks) == 2
    # files of the interrupted save are gone or reused; only what the manifest names is left
    names = sorted(p.name for p in directory.iterdir())
    assert names == [
        "manifest.json",
        "state-000002.safetensors",
        "task-0000.safetensors",
        "task-0001.safetensors",
    ]


# ----------------------------------------------------------------- through the CLI
def test_evaluate_recomputes_results_from_the_checkpoint(cli_run):
    result = runner.invoke(app, ["evaluate", "--run", str(cli_run)])
    assert result.exit_code == 0, result.output
    assert "all 3 tasks match results.json" in result.output
    # a results.json that disagrees is reported, with a non-zero exit
    doc = json.loads((cli_run / "results.json").read_text())
    doc["final_accuracy"][1] += 1.0
    (cli_run / "results.json").write_text(json.dumps(doc))
    result = runner.invoke(app, ["evaluate", "--run", str(cli_run)])
    assert result.exit_code == 1
    assert "tasks [1] differ from results.json" in result.output


def test_info_reports_per_task_storage(cli_run):
    result = runner.invoke(app, ["info", "--run", str(cli_run)], terminal_width=200)
    assert result.exit_code == 0, result.output
    doc = json.loads((cli_run / "results.json").read_text())
    total = doc["total_weights"]  # 784*64 + 64*48 + 48*10 weights
    assert total == 784 * 64 + 64 * 48 + 48 * 10
    manifest = json.loads((cli_run / "checkpoint" / "manifest.json").read_text())
    sizes = {n: math.prod(shape) for n, shape in manifest["architecture"]["layers"].items()}
    assert sorted(sizes.values()) == sorted([784 * 64, 64 * 48, 48 * 10])
    lines = [line for line in result.output.splitlines() if line.startswith("│")]
    assert len(lines) == 3
    dense = 0  # one dense model per task, with its own gates and head
    for t, line in enumerate(lines):
        forms = manifest["tasks"][t]["masks"]
        task = load_file(str(cli_run / "checkpoint" / f"task-{t:04d}.safetensors"))
        # a derived mask costs nothing; an explicit one its bits (or 4 bytes per index)
        weight_bytes = sum(
            v.numel() * v.element_size() for k, v in task.items() if k.startswith("weights.")
        )
        assert weight_bytes <= sum(-(-sizes[n] // 8) for n in sizes)
        assert weight_bytes == 0 or any(f in ("bits", "indices") for f in forms.values())
        mask_bytes = weight_bytes + (64 // 8 + 48 // 8)
        state_bytes = 0  # the paper's FC task: released gates, no head bias, nothing stored
        dense += 4 * total + state_bytes
        assert state_bytes == sum(
            v.numel() * v.element_size() for k, v in task.items() if k.startswith("state.")
        )
        cells = [c.strip() for c in line.strip("│").split("│")]
        assert cells[0] == str(t)
        assert cells[1] == f"{doc['flops_ratio'][t]:.3f}"
        assert cells[2] == f"{doc['used_weights'][t]:,}"
        assert cells[3] == f"{doc['new_weights'][t]:,}"
        assert cells[4] == "+".join(sorted(set(forms.values())))
        assert cells[5] == f"{mask_bytes:,}"
        assert cells[6] == f"{state_bytes:,}"
        assert cells[7] == f"{mask_bytes + state_bytes:,}"
        assert cells[8] == f"{manifest['tasks'][t]['bytes']:,}"
    owner_bytes = manifest["owner_bits"] * sum(-(-n // 8) for n in sizes.values())
    assert f"owner ids: {owner_bytes / 2**10:.1f} KiB (2 bits per weight" in result.output
    on_disk = sum(p.stat().st_size for p in (cli_run / "checkpoint").iterdir())
    assert f"checkpoint {on_disk / 2**10:.1f} KiB on disk" in " ".join(result.output.split())
    assert f"the checkpoint is {on_disk / dense:.3f} of that" in " ".join(result.output.split())


@pytest.mark.parametrize("how", ["truncated task file", "flipped byte", "newer format"])
def test_cli_refuses_a_damaged_checkpoint(cli_run, how):
    message = corrupt(cli_run / "checkpoint", how)
    for command in (["evaluate"], ["info"], ["export", "--task", "0", "--out", "x.pt2"]):
        result = runner.invoke(app, [*command, "--run", str(cli_run)])
        assert result.exit_code == 2, result.output
        assert message.replace(" ", "") in "".join(result.output.split())  # wrapped anywhere


def test_cli_refuses_a_run_without_checkpoint(tmp_path):
    result = runner.invoke(app, ["info", "--run", str(tmp_path)])
    assert result.exit_code == 2
    assert "no checkpoint in" in result.output and "manifest.json not found" in " ".join(
        result.output.split()
    )


def test_engine_state_is_restored(tmp_path):
    """The data-order generator and the mixed-precision loss scale carry over to later tasks."""
    sn, seq, engine = train_tiny("fc", n_tasks=1)
    engine.scaler = torch.amp.GradScaler("cpu")
    state = engine.scaler.state_dict() | {"scale": 512.0, "_growth_tracker": 3}
    engine.scaler.load_state_dict(state)
    torch.randn(3, generator=engine.generator)
    CheckpointWriter(tmp_path, META).save(
        sn, [], generator=engine.generator, grad_scaler=scaler_state(engine)
    )
    other = fresh_supernet("fc", seq)
    fresh = Engine(other, engine.strategy, engine.optim, 16, seed=99)
    fresh.scaler = torch.amp.GradScaler("cpu")
    ckpt = read_checkpoint(tmp_path)
    restore(ckpt, other)
    continue_training(ckpt, other, fresh, engine.strategy)
    assert fresh.scaler.state_dict() == state
    assert torch.equal(fresh.generator.get_state(), engine.generator.get_state())


def test_the_checkpoint_package_only_stores() -> None:
    """``espn.checkpoint`` reads and writes files: it imports no training, method, model,
    configuration or run-assembly code (only espn's errors, limits, file helpers and the
    supernet types whose tensors it lays out), so storing never drives training."""
    import ast

    import espn.checkpoint as package

    allowed = (
        "espn._version",
        "espn.checkpoint",
        "espn.errors",
        "espn.utils.limits",
        "espn.utils",
        "espn.supernet",
    )
    found: dict[str, set[str]] = {}
    for path in Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                # ``from espn import x`` names x; ``from espn.a import x`` the module espn.a
                names = (
                    [f"espn.{a.name}" for a in node.names]
                    if node.module == "espn"
                    else [node.module]
                )
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "espn":
                    found.setdefault(name, set()).add(path.name)
    outside = {name: files for name, files in found.items() if not name.startswith(allowed)}
    assert not outside, outside
    assert any(name.startswith("espn.checkpoint") for name in found)  # the walk saw imports
