"""Bad input, faults and scale: every case found by fuzzing the CLI is refused or stopped with
one clear line (exit 2), nothing computed is lost, and guarantees hold or the run stops."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors import SafetensorError
from typer.testing import CliRunner

import espn.checkpoint.store as store_module
import espn.data.mnist as mnist_module
from espn.checkpoint import read_checkpoint
from espn.cli.main import app
from espn.methods.base import Strategy
from espn.runs.config import ConfigError, make_config
from helpers.deploy import cli_options, comparable

runner = CliRunner()
LOCK_FILE = ".espn-run.lock"


@pytest.fixture(autouse=True)
def tiny(fake_mnist, fc_test_model):
    """Every test here runs model ``fc-test`` on the fake data."""


def invoke(args: list[str], **kw) -> object:
    return runner.invoke(app, [str(a) for a in args], **kw)


def one_line_error(result, code: int = 2) -> str:
    """The one ``error:`` line of a failed command (no traceback), space-normalised."""
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    return " ".join(lines[0].split())


def run_args(out: Path, *extra: str) -> list[str]:
    return [*cli_options(out), *extra]


def fingerprint(out: Path) -> dict:
    manifest = json.loads((out / "checkpoint" / "manifest.json").read_text())
    return {
        "results": comparable(json.loads((out / "results.json").read_text())),
        "tasks": [t["sha256"] for t in manifest["tasks"]],
        "state": manifest["state"]["sha256"],
    }


# ------------------------------------------------------------------ options out of range
@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--lr", "inf"),
        ("--lr", "nan"),
        ("--weight-decay", "inf"),
        ("--weight-decay", "nan"),
        ("--penalty", "nan"),
        ("--penalty", "inf"),
        ("--gamma", "nan"),
        ("--alpha", "nan"),
        ("--momentum", "nan"),
    ],
)
def test_non_finite_float_options_are_refused(tmp_path, flag, value):
    out = tmp_path / "r"
    line = one_line_error(invoke(run_args(out, flag, value)))
    name = flag[2:].replace("-", "_")  # a training setting or ESPN's own option: declared
    assert f"{name} must be a finite number, got {value}" in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--batch-size", "99999999999999999999", "batch_size must be <= 2147483647"),
        ("--seed", "9223372036854775807", "seed must be in [0, 4294967295]"),
        ("--seed", "18446744073709551616", "seed must be in [0, 4294967295]"),
        ("--image-size", "64", "image_size is only used by image-folders"),
        ("--tasks", "1000000", "tasks must be <= 1000 for permuted-mnist"),
    ],
)
def test_out_of_range_integers_are_refused_before_anything_is_built(
    tmp_path, monkeypatch, flag, value, message
):
    def no_data(*args, **kwargs):
        raise AssertionError("the dataset must not be loaded for a refused option")

    monkeypatch.setattr(mnist_module, "load_mnist_like", no_data)
    out = tmp_path / "r"
    assert message in one_line_error(invoke(run_args(out, flag, value)))
    assert not out.exists()


def test_image_size_is_bounded_and_presets_cannot_pass_booleans_as_numbers(tmp_path):
    with pytest.raises(ConfigError, match="image_size must be <= 1024, got 100000"):
        make_config(benchmark="image-folders", folders=(tmp_path,), image_size=100000)
    preset = tmp_path / "p.json"
    preset.write_text(json.dumps({"config": {"benchmark": "permuted-mnist", "tasks": True}}))
    line = one_line_error(invoke(["run", "--preset", preset, "--out", tmp_path / "r"]))
    assert "tasks must be a number, got True" in line


def test_theory_options_must_be_finite(tmp_path):
    for command, flag in (
        ("sample-complexity", "--noise"),
        ("sample-complexity", "--head-norm"),
        ("mismatch", "--perturbations"),
        ("task-order", "--bound-slack"),
    ):
        result = invoke(["theory", command, "--out", tmp_path, flag, "inf", "--no-progress"])
        assert f"{flag}: must be a finite number, got inf" in one_line_error(result)
    assert not list(tmp_path.iterdir())


def test_theory_report_refuses_non_csv_and_non_numbers(tmp_path):
    binary = tmp_path / "x.csv"
    binary.write_bytes(bytes(range(256)) * 4)
    assert "is not a CSV file" in one_line_error(invoke(["theory", "report", binary]))
    good = tmp_path / "good"
    ok = invoke(
        ["theory", "task-order", "--out", good, "--d", "6", "--r", "2", "--tasks", "2",
         "--heads", "1", "--n-max", "8", "--n-min", "4", "--replicates", "1", "--restarts", "1",
         "--max-iter", "5", "--n-test", "10", "--no-progress"]
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output
    text = (good / "task_order.csv").read_text().splitlines()
    header, row = text[0].split(","), text[1].split(",")
    row[header.index("test_risk")] = "oops"
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([text[0], ",".join(row), *text[2:]]) + "\n")
    line = one_line_error(invoke(["theory", "report", bad]))
    assert "line 2, column test_risk: 'oops' is not a number" in line


# ------------------------------------------------------------------ guarantees
def test_gamma_below_the_reachable_flops_is_refused_before_training(tmp_path):
    out = tmp_path / "r"
    line = one_line_error(invoke(run_args(out, "--gamma", "1e-300")))
    assert "gamma 1e-300 is below the smallest FLOPs ratio model fc-test can reach" in line
    assert not (out / "results.json").exists() and not (out / "checkpoint").exists()


def test_a_task_over_its_flops_budget_is_never_recorded():
    from espn.training.capacity import TrainingStopped, check_budget

    check_budget(0.2, {"flops_ratio": 0.2}, "t", 0)
    with pytest.raises(TrainingStopped, match=r"task 2 \(t\): .* 0\.5 of the dense FLOPs"):
        check_budget(0.2, {"flops_ratio": 0.5}, "t", 2)
    with pytest.raises(TrainingStopped):
        check_budget(0.2, {"flops_ratio": float("nan")}, "t", 0)


def test_a_diverging_task_stops_and_keeps_the_last_good_checkpoint(
    tmp_path, monkeypatch, finished_run
):
    """``finished_run`` is the same run (``cli_options``) uninterrupted: the reference."""
    import espn.methods.espn as espn_module

    reference = finished_run
    real_loss, real_prune = Strategy.loss, espn_module.ESPN.prune_step

    def prune_step(self, supernet, progress):  # from task 2's first prune step on ...
        self.diverged = len(supernet.masks) == 1
        return real_prune(self, supernet, progress)

    def loss(self, logits, y):  # ... the loss is NaN
        value = real_loss(self, logits, y)
        return value * float("nan") if getattr(self, "diverged", False) else value

    with monkeypatch.context() as patch:
        patch.setattr(espn_module.ESPN, "prune_step", prune_step)
        patch.setattr(Strategy, "loss", loss)
        out = tmp_path / "r"
        line = one_line_error(invoke(run_args(out)))
    assert "task 1 (permutation 1), prune phase, epoch 1/2: the training loss is not finite" in line
    assert f"the last good checkpoint is {out / 'checkpoint'} (1 task(s) finished" in line
    ckpt = read_checkpoint(out / "checkpoint")
    assert len(ckpt.masks) == 1 and ckpt.training is not None
    assert ckpt.training.task == 1 and ckpt.training.position["phase"] == 1  # after pre-training
    assert len(json.loads((out / "results.json").read_text())["task_names"]) == 1
    resumed = invoke(run_args(out, "--resume"))  # the cause gone, it ends as if never stopped
    assert resumed.exit_code == 0, resumed.output
    assert fingerprint(out) == fingerprint(reference)


def test_capacity_running_out_stops_before_the_task_that_gets_no_weights(tmp_path):
    out = tmp_path / "r"
    line = one_line_error(invoke(run_args(out, "--alpha", "1", "--gamma", "1")))
    assert "task 1 (permutation 1) would get no new weights: the earlier tasks took every" in line
    doc = json.loads((out / "results.json").read_text())
    assert doc["task_names"] == ["permutation 0"] and doc["complete"] is False
    assert len(read_checkpoint(out / "checkpoint").masks) == 1


# ------------------------------------------------------------------ run directories
def test_anything_that_looks_like_a_run_is_not_overwritten(cli_run, tmp_path):
    assert not (cli_run / LOCK_FILE).exists()  # a finished run released its lock
    before = (cli_run / "results.json").read_bytes()
    (cli_run / "checkpoint" / "manifest.json").unlink()
    line = one_line_error(invoke(run_args(cli_run)))
    assert "already holds a run's output (results.json, accuracy.png, checkpoint)" in line
    line = one_line_error(invoke(run_args(cli_run, "--resume")))
    assert "holds results.json but no checkpoint" in line and "--overwrite" in line
    assert (cli_run / "results.json").read_bytes() == before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "results.json").write_text('{"mine": 1}\n')
    assert "already holds a run's output" in one_line_error(invoke(run_args(foreign)))
    assert (foreign / "results.json").read_text() == '{"mine": 1}\n'
    assert invoke(run_args(foreign, "--overwrite", "--tasks", "1")).exit_code == 0
    assert json.loads((foreign / "results.json").read_text())["task_names"] == ["permutation 0"]


def test_overwrite_removes_the_earlier_results_at_once(cli_run, monkeypatch):
    import espn.methods.espn as espn_module

    def interrupt(self, supernet, progress):
        raise KeyboardInterrupt

    monkeypatch.setattr(espn_module.ESPN, "prune_step", interrupt)
    one_line_error(invoke(run_args(cli_run, "--overwrite")), code=130)
    assert not (cli_run / "results.json").exists() and not (cli_run / "accuracy.png").exists()


def test_bad_out_directories_are_refused_before_training(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    assert "is a file, not a directory" in one_line_error(invoke(run_args(file)))
    assert "a part of the path is a file" in one_line_error(invoke(run_args(file / "sub")))
    result = invoke([*cli_options(tmp_path)[:-4], "--out", "", "--no-progress"])
    assert result.exit_code == 2 and "must name a directory" in result.output
    assert file.read_text() == "x"


def test_read_only_out_is_refused_before_training(tmp_path, monkeypatch):
    locked = tmp_path / "ro"
    locked.mkdir()
    if os.geteuid() != 0:  # the real refusal; root writes anywhere, so it is simulated below
        locked.chmod(0o555)
        try:
            line = one_line_error(invoke(run_args(locked / "r")))
        finally:
            locked.chmod(0o755)
        assert "cannot create --out" in line or "cannot write into" in line
    real_mkdir, real_access = Path.mkdir, os.access

    def mkdir(self, *args, **kwargs):
        if self.parent == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    line = one_line_error(invoke(run_args(locked / "new")))
    assert line.endswith(f"cannot create --out {locked / 'new'}: Permission denied")
    monkeypatch.setattr(os, "access", lambda p, m: Path(p) != locked and real_access(p, m))
    line = one_line_error(invoke(run_args(locked)))
    assert line.endswith(f"cannot write into --out {locked}: permission denied")
    assert not list(locked.iterdir())


def test_a_second_run_on_one_directory_is_refused_at_once(tmp_path):
    from espn.checkpoint.lock import run_lock

    out = tmp_path / "r"
    with run_lock(out):
        line = one_line_error(invoke(run_args(out)))
        line2 = one_line_error(invoke(run_args(out, "--overwrite")))
    assert f"is in use by another espn run (pid {os.getpid()}" in line
    assert "is in use by another espn run" in line2
    assert not (out / "results.json").exists()
    assert not (out / LOCK_FILE).exists()  # released
    # a lock file left by a killed run (no process holds it) is stale: taken over
    (out / LOCK_FILE).write_text(json.dumps({"pid": 999999, "host": "h", "started": "t"}))
    assert invoke(run_args(out)).exit_code == 0
    assert not (out / LOCK_FILE).exists()


# ------------------------------------------------------------------ damaged manifests
def _edit(manifest: dict, results: dict, case: str) -> None:
    if case == "tasks-not-a-list":
        manifest["tasks"] = "oops"
    elif case == "accuracy-string":
        manifest["tasks"][1]["accuracy"] = "high"
    elif case == "no-tasks":
        manifest["tasks"], manifest["complete"] = [], False
    elif case == "model-changed":
        manifest["model"] = "fc1024"
    elif case == "absolute-file":
        manifest["tasks"][0]["file"] = "/etc/hostname"
    elif case == "file-outside":
        manifest["state"]["file"] = "../results.safetensors"
    elif case == "other-results":
        results["config"]["seed"] = 7


CASES = [
    ("tasks-not-a-list", "tasks: Input should be a valid list"),
    ("accuracy-string", "tasks.1.accuracy: Input should be a valid list"),
    ("no-tasks", "results.json records 3 finished task(s), the checkpoint 0"),
    ("model-changed", "model is 'fc1024' but the recorded configuration says 'fc-test'"),
    ("absolute-file", "'/etc/hostname' is not a plain *.safetensors name"),
    ("file-outside", "'../results.safetensors' is not a plain *.safetensors name"),
    ("other-results", "results.json was written with other options than the checkpoint"),
]


@pytest.mark.parametrize(("case", "message"), CASES)
def test_damaged_manifests_are_refused_by_every_reader(cli_run, case, message):
    path = cli_run / "checkpoint" / "manifest.json"
    manifest, results = (
        json.loads(path.read_text()),
        json.loads((cli_run / "results.json").read_text()),
    )
    _edit(manifest, results, case)
    path.write_text(json.dumps(manifest))
    (cli_run / "results.json").write_text(json.dumps(results))
    before = {p.name: p.read_bytes() for p in (cli_run / "checkpoint").iterdir()}
    for args in (
        ["evaluate", "--run", cli_run],
        ["info", "--run", cli_run],
        ["export", "--run", cli_run, "--task", "0", "--out", cli_run / "t.pt2"],
        run_args(cli_run, "--resume"),
    ):
        assert message in one_line_error(invoke(args)), args
    assert {p.name: p.read_bytes() for p in (cli_run / "checkpoint").iterdir()} == before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "is not an espn results.json (not a JSON object)"),
        (
            '{"task_names": ["a"]}',
            "is not an espn results.json (config: Field required; and 4 more)",
        ),
    ],
)
def test_show_and_evaluate_refuse_a_damaged_results_json(cli_run, text, message):
    (cli_run / "results.json").write_text(text)
    assert message in one_line_error(invoke(["show", cli_run]))
    assert message in one_line_error(invoke(["evaluate", "--run", cli_run]))


def test_wrong_types_in_results_json_are_named(cli_run):
    doc = json.loads((cli_run / "results.json").read_text())
    doc["flops_ratio"] = doc["flops_ratio"][:1]
    (cli_run / "results.json").write_text(json.dumps(doc))
    line = one_line_error(invoke(["show", cli_run]))
    assert "flops_ratio has 1 entries for 3 tasks" in line
    assert "no results.json in" in one_line_error(invoke(["show", cli_run / "checkpoint"]))


# ------------------------------------------------------------------ faults
def test_a_full_disk_leaves_the_previous_checkpoint_and_no_temporary_files(
    tmp_path, monkeypatch, finished_run
):
    reference = finished_run  # the same run (``cli_options``) uninterrupted
    out = tmp_path / "r"
    real_save = store_module.save_file
    calls = {"n": 0}

    def full_disk(tensors, path):
        calls["n"] += 1
        if calls["n"] == 9:  # in the second task
            Path(path).write_bytes(b"partial")
            raise SafetensorError("Error while serializing: No space left on device (os error 28)")
        return real_save(tensors, path)

    monkeypatch.setattr(store_module, "save_file", full_disk)
    line = one_line_error(invoke(run_args(out)))
    assert f"could not write the checkpoint in {out / 'checkpoint'}" in line
    assert "No space left on device" in line
    assert "the previous checkpoint there (1 task(s) finished) is intact" in line
    assert "partly written files were removed" in line
    names = sorted(p.name for p in (out / "checkpoint").iterdir())
    manifest = json.loads((out / "checkpoint" / "manifest.json").read_text())
    assert names == sorted(
        ["manifest.json", manifest["state"]["file"], *(t["file"] for t in manifest["tasks"])]
    )
    assert not list(out.glob(".*"))
    monkeypatch.setattr(store_module, "save_file", real_save)
    resumed = invoke(run_args(out, "--resume"))
    assert resumed.exit_code == 0, resumed.output
    assert fingerprint(out) == fingerprint(reference)


def test_ctrl_c_says_where_the_checkpoint_is_and_how_to_resume(tmp_path, monkeypatch):
    import espn.methods.espn as espn_module

    original = espn_module.ESPN.prune_step

    def interrupt(self, supernet, progress):
        if len(supernet.masks) == 1:
            raise KeyboardInterrupt
        return original(self, supernet, progress)

    monkeypatch.setattr(espn_module.ESPN, "prune_step", interrupt)
    out = tmp_path / "r"
    line = one_line_error(invoke(run_args(out)), code=130)
    assert (
        f"interrupted; the last checkpoint (1 task(s) finished) is in {out / 'checkpoint'}" in line
    )
    command = line.split("continue with: ")[1]
    assert command.startswith("espn run ") and command.endswith(" --resume")
    assert f"--out {out}" in command and "--model fc-test" in command
    assert "--epochs 1,2,1" in command and "--no-progress" in command
    assert not (out / LOCK_FILE).exists()


def test_unexpected_errors_are_one_line_unless_debug_is_asked(tmp_path, monkeypatch):
    import espn.api.experiment as experiment_module

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(experiment_module, "run_experiment", broken)
    line = one_line_error(invoke(run_args(tmp_path / "r")), code=1)
    assert "unexpected RuntimeError: boom" in line and "--debug" in line
    shown = invoke(["--debug", *run_args(tmp_path / "r")])
    assert isinstance(shown.exception, RuntimeError)
    shown = invoke(run_args(tmp_path / "r"), env={"ESPN_DEBUG": "1"})
    assert isinstance(shown.exception, RuntimeError)


# ------------------------------------------------------------------ export
def test_export_out_is_checked_before_any_work(cli_run, tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    for out, message in (
        (tmp_path, "is a directory; give a file name ending in .pt2 or .onnx"),
        (file / "m.pt2", "is a file, not a directory"),
        (tmp_path / "m.txt", "cannot tell the export format"),
    ):
        result = invoke(["export", "--run", cli_run, "--task", "0", "--out", out])
        assert message in one_line_error(result)


def test_the_load_hint_fits_the_exported_format():
    from espn.cli.deploy import load_hint

    onnx = load_hint(Path("y.onnx"), ["y.onnx"])
    assert "onnxruntime.InferenceSession('y.onnx')" in onnx and "torch.export" not in onnx
    assert load_hint(Path("y.pt2"), ["y.pt2"]) == "torch.export.load('y.pt2').module()"


# ------------------------------------------------------------------ silently accepted before
def test_more_images_than_the_data_has_is_warned_and_recorded(tmp_path, fake_mnist):
    out = tmp_path / "r"
    result = invoke(run_args(out, "--train-per-task", "70000", "--test-per-task", "150"))
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "warning: train_per_task 70000 is more than the 400 train images a task has" in text
    doc = json.loads((out / "results.json").read_text())
    assert doc["train_samples"] == [400] * 3 and doc["test_samples"] == [150] * 3
    assert len(doc["warnings"]) == 1 and "70000" in doc["warnings"][0]


def test_an_unusable_data_dir_is_refused(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    assert "data_dir" in one_line_error(invoke(run_args(tmp_path / "a", "--data-dir", file)))
    line = one_line_error(invoke(run_args(tmp_path / "b", "--data-dir", tmp_path / "missing")))
    assert "does not exist" in line


def test_a_one_class_image_folder_is_refused(tmp_path):
    from test_image_benchmarks import write_folder

    write_folder(tmp_path / "one", ["cat"], 4, (12, 12), 0)
    write_folder(tmp_path / "two", ["cat", "dog"], 4, (12, 12), 1)
    folders = f"{tmp_path / 'two'},{tmp_path / 'one'}"
    args = ["run", "--benchmark", "image-folders", "--folders", folders, "--out", tmp_path / "r"]
    line = one_line_error(invoke([*args, "--image-size", "16", "--no-progress"]))
    assert "one: a task needs at least 2 classes (class directories), found 1: cat" in line
