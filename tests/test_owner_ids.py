"""Masks as owner ids: every task's sub-network reproduced bit for bit from the compact form,
explicit masks where ownership does not describe them, > 255 tasks, and version-1
checkpoints converted on read and resumed exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from espn.api.experiment import run_experiment
from espn.checkpoint import CheckpointWriter, read_checkpoint, restore
from espn.checkpoint.format import MANIFEST, file_entry, sha256_of
from espn.cli.main import app
from espn.evaluation.metrics import backward_transfer, forgetting, task_logits
from espn.evaluation.storage import storage_report
from espn.methods.base import METHODS, MethodConfig
from espn.models.fc import FCNet
from espn.models.registry import MODELS, ModelSpec
from espn.runs.config import make_config
from espn.runs.loading import load_run
from espn.supernet import Supernet, pack_bits
from espn.supernet.masks import Ownership, owner_dtype
from espn.training.engine import Engine
from espn.training.optim import OptimConfig
from espn.utils.io import write_json_atomic
from helpers.baseline import tiny_sequence
from helpers.deploy import Killed, comparable, kill_at_step, run_options

runner = CliRunner()

#: what a checkpoint's manifest records of the benchmark (shapes only matter for tracing)
SPEC = {"input_shape": [1, 28, 28], "n_classes": 3, "multi_head": False}


def train(model_name: str, shape: tuple[int, ...], method: str, reuse: str, n_tasks: int = 3):
    """Train ``n_tasks`` tiny tasks into a registered model; per task, the frozen weights
    before it, the dense weight mask it was committed with and its logits right after."""
    seq = tiny_sequence(n_tasks=n_tasks, shape=shape, n=32)
    torch.manual_seed(0)
    model = MODELS.get(model_name)(ModelSpec(shape, 3, model_name != "fc1024"))
    sn = Supernet(model, seq.tasks[0].train.x[:2])
    gamma = 0.5 if METHODS.get(method).uses_gamma else 1.0
    # reuse is an option of the methods that declare it (ESPN's), the others reuse all
    own = {"reuse": reuse} if "reuse" in METHODS.get(method).option_names() else {}
    cfg = MethodConfig(
        gamma=gamma, alpha=0.2, epochs=(1, 1, 1), prune_updates_per_epoch=1, method_options=own
    )
    engine = Engine(sn, METHODS.get(method)(cfg), OptimConfig("adam", lr=1e-2), 16, 0)
    before, dense, logits = [], [], []
    for t, task in enumerate(seq.tasks):
        before.append({n: m.frozen.clone() for n, m in sn.layers.items()})
        engine.train_task(task, t)
        dense.append({n: m.weight_mask.bool().clone() for n, m in sn.layers.items()})
        logits.append(task_logits(sn, task, t))
    return sn, seq, engine, before, dense, logits


def check_every_task(sn: Supernet, seq, dense, logits) -> None:
    """Every task's decoded mask and logits equal those it was committed with."""
    for t, task in enumerate(seq.tasks):
        for name in sn.layers:
            assert torch.equal(sn.masks[t].weight_mask(name), dense[t][name].cpu())
        assert torch.equal(task_logits(sn, task, t), logits[t]), f"task {t} changed"


@pytest.mark.parametrize("method", ["espn", "packnet"])
@pytest.mark.parametrize(
    "model_name,shape", [("fc1024", (1, 28, 28)), ("resnet18-reduced", (3, 8, 8))]
)
def test_owner_ids_reproduce_every_tasks_logits_bit_for_bit(tmp_path, method, model_name, shape):
    sn, seq, engine, before, dense, logits = train(model_name, shape, method, reuse="all")
    for t, mask in enumerate(sn.masks):
        # every layer (fc1024's shared head included) stored as the weights tasks <= t own:
        # nothing per task but the unit masks and the task state
        assert set(mask.forms.values()) <= {"owned", "structure"}
        assert "owned" in mask.forms.values()
        assert mask.nbytes()["weight_masks"] == 0
        for name in sn.layers:  # t owns the weights of its mask that were free before it
            assert torch.equal(sn.owners.ids[name] == t, dense[t][name] & ~before[t][name])
        assert mask.new_weights == sum(int((ids == t).sum()) for ids in sn.owners.ids.values())
    if method == "espn":  # dead units exist and their weights are outside the masks
        assert any(not bool(a.all()) for m in sn.masks for a in m.units.values())
    if model_name == "fc1024":
        assert "head.0" in sn.layers  # the shared head is a masked, owned layer
    check_every_task(sn, seq, dense, logits)
    # the frozen weights are exactly the owned ones
    for name, layer in sn.layers.items():
        assert torch.equal(layer.frozen, sn.owners.ids[name] != 255)
    # and a checkpoint holds them as owner ids: a fresh supernet reproduces every task
    CheckpointWriter(
        tmp_path / "checkpoint",
        {"model": model_name, "benchmark": "tiny", "config": {}, "spec": SPEC},
    ).save(sn, [], generator=engine.generator)
    torch.manual_seed(1)
    other = Supernet(
        MODELS.get(model_name)(ModelSpec(shape, 3, model_name != "fc1024")),
        seq.tasks[0].train.x[:2],
    )
    restore(read_checkpoint(tmp_path / "checkpoint"), other)
    check_every_task(other, seq, dense, logits)
    manifest = json.loads((tmp_path / "checkpoint" / MANIFEST).read_text())
    for t, entry in enumerate(manifest["tasks"]):  # gates/BatchNorm of dead units: not stored
        stored = load_file(str(tmp_path / "checkpoint" / entry["file"]))
        cut = entry["alive_only"]
        # PackNet keeps every unit: nothing to cut; the paper's FC task stores no gate at all
        assert bool(cut) == (method == "espn" and model_name != "fc1024")
        # statistics recomputed under the final sub-network are exactly 0 on dead channels,
        # so they are cut like the affine parameters (and restored bit for bit, below)
        assert all(k.endswith(("weight", "bias", "running_mean", "running_var")) for k in cut)
        for key, group in cut.items():
            assert stored[f"state.{key}"].numel() == int(sn.masks[t].units[group].sum())
        assert all(torch.equal(other.masks[t].state[k], v) for k, v in sn.masks[t].state.items())
    for name in sn.layers:
        assert torch.equal(other.owners.ids[name], sn.owners.ids[name])
        assert torch.equal(other.layers[name].frozen, sn.layers[name].frozen)


@pytest.mark.parametrize("method,reuse", [("supsup", "all"), ("espn", "magnitude")])
def test_masks_ownership_does_not_describe_are_stored_explicitly(tmp_path, method, reuse):
    sn, seq, engine, _, dense, logits = train("fc1024", (1, 28, 28), method, reuse)
    explicit = 0
    for t, mask in enumerate(sn.masks):
        for name, layer in sn.layers.items():
            form = mask.form(name)
            if method == "supsup":  # fixed weights: never stored as owned
                assert form in ("bits", "indices")
            if form in ("bits", "indices"):
                explicit += 1
                nnz, numel = int(dense[t][name].sum()), layer.weight.numel()
                payload = mask.weights[name]
                assert payload.numel() * payload.element_size() == min((numel + 7) // 8, 4 * nnz)
                assert payload.dtype == (torch.uint8 if form == "bits" else torch.int32)
    assert explicit > 0
    check_every_task(sn, seq, dense, logits)
    if method == "supsup":  # storage as before: one bit per weight per task, no owner ids
        report = storage_report(sn, "fixed")
        assert report["owner_ids"] == 0
        assert report["weight_masks"] == 3 * sum(
            (m.weight.numel() + 7) // 8 for m in sn.layers.values()
        )
    path = tmp_path / "checkpoint"
    CheckpointWriter(
        path, {"model": "fc1024", "benchmark": "tiny", "config": {}, "spec": SPEC}
    ).save(sn, [], generator=engine.generator)
    torch.manual_seed(1)
    other = Supernet(
        MODELS.get("fc1024")(ModelSpec((1, 28, 28), 3, False)), seq.tasks[0].train.x[:2]
    )
    restore(read_checkpoint(path), other)
    check_every_task(other, seq, dense, logits)


def test_owner_dtype_widens_past_255_tasks():
    assert owner_dtype(1) == owner_dtype(255) == torch.uint8
    assert owner_dtype(256) == owner_dtype(32767) == torch.int16
    assert owner_dtype(32768) == torch.int32
    owners = Ownership.empty({}, "cpu")
    assert owners.dtype == torch.uint8
    from espn.supernet.masks import LayerLayout

    layout = {"w": LayerLayout((2, 3), None, None)}
    owners = Ownership.empty(layout, "cpu")
    owners.take({"w": torch.tensor([[True, False, False], [False, False, False]])}, 254)
    owners.take({"w": torch.tensor([[True, True, False], [False, False, False]])}, 255)
    assert owners.dtype == torch.int16  # task 255 did not fit uint8 beside the free sentinel
    assert owners.ids["w"].tolist() == [[254, 255, 32767], [32767, 32767, 32767]]
    assert owners.owned("w", 254).tolist() == [[True, False, False], [False, False, False]]


@torch.no_grad()
def random_task(sn: Supernet, t: int, gen: torch.Generator, keep_all: bool) -> None:
    """A task committed without training: random alive units, a few free weights between
    them, every frozen weight between them (or all but one: an explicit mask), random gates
    and head."""
    sn.begin_task(2)
    units = {g: torch.rand(n, generator=gen) < 0.7 for g, n in sn.group_sizes.items()}
    for alive in units.values():
        alive[int(torch.randint(len(alive), (1,), generator=gen))] = True
    sn.set_unit_masks(units)
    for m in sn.task_modules.values():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    sn.set_unit_masks(units)  # dead gates back to exactly zero
    masks = {}
    for name, layer in sn.layers.items():
        structure = sn.structural_mask(name)
        free = structure & ~layer.frozen
        pick = torch.zeros_like(free)
        if bool(free.any()):  # one new weight per layer: free ones last past task 255
            pick.view(-1)[torch.multinomial(free.flatten().float(), 1, generator=gen)] = True
        mask = pick | (structure & layer.frozen)
        if not keep_all and bool((structure & layer.frozen).any()):
            first = torch.nonzero((structure & layer.frozen).flatten())[0]
            mask.view(-1)[first] = False
        masks[name] = mask
    sn.set_weight_masks(masks)
    sn.commit_task("shared")


def test_more_than_255_tasks_round_trip_through_the_checkpoint(tmp_path):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    sn = Supernet(
        FCNet(64, [24, 16], 2, multi_head=True, task_affine=True), torch.zeros(2, 1, 8, 8)
    )
    x = torch.randn(8, 1, 8, 8, generator=gen)
    logits = []
    for t in range(300):
        random_task(sn, t, gen, keep_all=t % 7 != 3)
        sn.eval()
        logits.append(sn(x, task=t))
    assert sn.owners.dtype == torch.int16
    ids = torch.cat([v.flatten() for v in sn.owners.ids.values()])
    assert int(ids[ids != 32767].max()) > 255  # tasks past 255 own weights
    forms = [set(m.forms.values()) for m in sn.masks]
    assert all(f <= {"owned", "structure"} for t, f in enumerate(forms) if t % 7 != 3)
    assert any(f & {"bits", "indices"} for f in forms)
    engine = Engine(sn, METHODS.get("espn")(MethodConfig()), OptimConfig("adam", lr=1e-3), 8, 0)
    meta = {"model": "tiny", "benchmark": "tiny", "config": {}, "spec": SPEC}
    CheckpointWriter(tmp_path / "checkpoint", meta).save(sn, [], generator=engine.generator)
    state = load_file(str(tmp_path / "checkpoint" / "state-000001.safetensors"))
    manifest = json.loads((tmp_path / "checkpoint" / MANIFEST).read_text())
    assert manifest["owner_bits"] == 9  # ids up to 299 and the sentinel 511: 9 bit-planes
    for name, layer in sn.layers.items():
        assert state[f"owner.{name}"].numel() == 9 * -(-layer.weight.numel() // 8)
    torch.manual_seed(5)
    other = Supernet(
        FCNet(64, [24, 16], 2, multi_head=True, task_affine=True), torch.zeros(2, 1, 8, 8)
    )
    restore(read_checkpoint(tmp_path / "checkpoint"), other)
    other.eval()
    assert len(other.masks) == 300
    for t in range(300):
        assert torch.equal(other(x, task=t), logits[t]), f"task {t}"
        for name in sn.layers:
            assert torch.equal(other.masks[t].weight_mask(name), sn.masks[t].weight_mask(name))


# ------------------------------------------------------------------- version-1 checkpoints
def write_version_1(directory: Path, masks: list) -> None:
    """Rewrite a checkpoint in the layout of format version 1 (espn before owner ids): every
    task's weight masks (``masks``, as loaded) bit-packed, unit masks as booleans, each task's
    layer shapes and accuracy row in the manifest, no owner ids in the state file."""
    manifest = read_checkpoint(directory).manifest  # accuracy rows read back into the entries
    layers = manifest["architecture"]["layers"]
    tasks = []
    for entry, mask in zip(manifest["tasks"], masks, strict=True):
        path = directory / entry["file"]
        old = {f"weights.{n}": pack_bits(mask.weight_mask(n)) for n in layers}
        old |= {f"units.{g}": a for g, a in mask.units.items()}
        old |= {f"state.{k}": v for k, v in mask.state.items()}
        old |= {f"own.{k}": v for k, v in mask.own.items()}
        save_file(old, str(path))
        kept = {k: v for k, v in entry.items() if k not in ("masks", "horizon", "bytes", "sha256")}
        tasks.append({**kept, **file_entry(path), "shapes": layers})
    state_path = directory / manifest["state"]["file"]
    state = {k: v for k, v in load_file(str(state_path)).items() if not k.startswith("owner.")}
    save_file(state, str(state_path))
    manifest["config"].pop("eval_every")  # an option version 1 did not have
    manifest |= {
        "format_version": 1,
        "tasks": tasks,
        "state": {**file_entry(state_path), "generation": manifest["state"]["generation"]},
    }
    write_json_atomic(directory / MANIFEST, manifest)


@pytest.fixture
def fc_test(fake_mnist, fc_test_model):
    """Model ``fc-test`` on the fake data."""


@pytest.mark.parametrize("kill", [17, 30])  # before task 2's first save; task 2 fine-tuning
def test_a_version_1_checkpoint_loads_and_resumes_exactly(tmp_path, monkeypatch, fc_test, kill):
    options = {"reuse": "all", "gamma": 0.5}
    reference = tmp_path / "reference"
    run_experiment(make_config(**run_options(reference, **options)), progress=False)
    out = tmp_path / "run"
    cfg = make_config(**run_options(out, **options))
    with monkeypatch.context() as mp:
        kill_at_step(mp, kill)
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    directory = out / "checkpoint"
    saved = load_run(out)
    write_version_1(directory, saved.supernet.masks)
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["format_version"] == 1 and "accuracy" in manifest["tasks"][0]
    assert not any(
        k.startswith("owner.") for k in load_file(str(directory / manifest["state"]["file"]))
    )
    old_format = read_checkpoint(directory)
    assert old_format.owner_ids is None and not any(m.forms for m in old_format.masks)
    # read as it is, converted on restore: same owner ids, masks in their compact form
    loaded = load_run(out)
    for name in saved.supernet.layers:
        assert torch.equal(loaded.supernet.owners.ids[name], saved.supernet.owners.ids[name])
    for old, new in zip(saved.supernet.masks, loaded.supernet.masks, strict=True):
        assert new.forms == old.forms and new.horizon == old.horizon
    old_task_file = sha256_of(directory / "task-0000.safetensors")
    run_experiment(cfg, progress=False, resume=True)
    want = json.loads((reference / "results.json").read_text())
    got = json.loads((out / "results.json").read_text())
    assert comparable(got) == comparable(want)
    manifest = json.loads((directory / MANIFEST).read_text())
    ref_manifest = json.loads((reference / "checkpoint" / MANIFEST).read_text())
    assert manifest["format_version"] == 2
    assert manifest["state"]["sha256"] == ref_manifest["state"]["sha256"]  # weights, owners, RNG
    assert sha256_of(directory / "task-0000.safetensors") == old_task_file  # kept as it was
    assert manifest["tasks"][0]["accuracy"] == want["accuracy_matrix"][0]
    for t in (1, 2):  # tasks learned after the resumption are written as version 2
        assert manifest["tasks"][t]["sha256"] == ref_manifest["tasks"][t]["sha256"]
    # and the mixed checkpoint reads back: every task reproduces the reference's logits
    ref, again = load_run(reference), load_run(out)
    x = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    for t in range(3):
        assert torch.equal(again.supernet(x, task=t), ref.supernet(x, task=t))
    result = runner.invoke(app, ["evaluate", "--run", str(out)])
    assert result.exit_code == 0, result.output


# ----------------------------------------------------------------------------- eval-every
def test_eval_every_keeps_rows_every_k_tasks_and_the_last(tmp_path, fc_test):
    full = tmp_path / "full"
    run_experiment(make_config(**run_options(full)), progress=False)
    sparse = tmp_path / "sparse"
    run_experiment(make_config(**run_options(sparse, eval_every=2)), progress=False)
    want = json.loads((full / "results.json").read_text())
    got = json.loads((sparse / "results.json").read_text())
    rows = got["accuracy_matrix"]
    assert [r is None for r in rows] == [True, False, False]  # after tasks 2 and 3 (the last)
    assert rows[1:] == want["accuracy_matrix"][1:]  # evaluation changes nothing else
    assert got["final_accuracy"] == want["final_accuracy"]
    assert got["new_weights"] == want["new_weights"] and got["flops"] == want["flops"]
    assert got["forgetting"] == forgetting([None, *want["accuracy_matrix"][1:]])
    assert got["backward_transfer"] == rows[2][1] - rows[1][1]
    assert backward_transfer(want["accuracy_matrix"]) == want["backward_transfer"]
    manifest = json.loads((sparse / "checkpoint" / MANIFEST).read_text())
    assert manifest["tasks"][0]["accuracy"] is None
    assert "accuracy" not in load_file(str(sparse / "checkpoint" / "task-0000.safetensors"))
    assert (sparse / "accuracy.png").stat().st_size > 0
    result = runner.invoke(app, ["show", str(sparse)])
    assert result.exit_code == 0, result.output
    assert "2 of 3 rows evaluated (every 2 tasks and the last)" in " ".join(result.output.split())
    result = runner.invoke(app, ["evaluate", "--run", str(sparse)])
    assert result.exit_code == 0, result.output
    # resuming needs the same --eval-every: the rows would differ
    with pytest.raises(ValueError, match="eval_every=2 in the checkpoint, 1 now"):
        run_experiment(make_config(**run_options(sparse)), progress=False, resume=True)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_eval_every_must_be_positive(tmp_path, value):
    result = runner.invoke(
        app,
        [
            "run",
            "--benchmark",
            "permuted-mnist",
            "--out",
            str(tmp_path / "r"),
            "--eval-every",
            value,
        ],
    )
    assert result.exit_code == 2
    assert f"eval_every must be >= 1, got {value}" in result.output
    assert not (tmp_path / "r").exists()
