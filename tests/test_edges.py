"""Correct at the edges (issue 37): no silent wrong answer (a supernet called without a task,
a task trained with no capacity left, options that cannot apply, an all-zero pretrained
task) and one clear EspnError for the raw errors and the hang a careless user met."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from typer.testing import CliRunner

import espn
import espn.data.tensors as tensors_module
from espn.api.checks import ApiArgumentError
from espn.cli.main import app
from espn.errors import EspnError
from espn.export.slim import ExportError
from espn.methods.base import MethodSettingError
from espn.models.checks import ModelShapeError
from espn.models.fc import FCNet
from espn.runs.config import ConfigError
from espn.supernet.pretrained import PretrainedError, adopt_pretrained, expected_shapes
from espn.supernet.supernet import Supernet, TaskRequired
from espn.training.capacity import TrainingStopped
from helpers.baseline import make_engine, tiny_sequence

runner = CliRunner()


def mlp(n_out: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, n_out))


def data(n: int = 24, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=gen), torch.arange(n) % classes


def learner(**settings: object) -> espn.ContinualLearner:
    x, _ = data()
    return espn.ContinualLearner(espn.wrap(mlp(), x), epochs=(1, 0, 0), **settings)


# ----------------------------------------------------------- item 10: which task answers
def test_a_supernet_called_without_a_task_is_refused_and_training_still_works() -> None:
    cl = learner()
    cl.learn(data(seed=1))
    cl.learn(data(seed=2))  # training runs the task in training explicitly
    sn, (x, _) = cl.supernet, data(seed=3)
    with pytest.raises(TaskRequired, match=r"needs task=.*learned tasks: 0\.\.1"):
        sn(x)
    with pytest.raises(TaskRequired, match="task index"):
        sn(x, task=True)
    first = sn(x, task=0)
    assert not torch.equal(first, sn(x, task=1))  # two heads: a guess would be wrong
    assert torch.equal(sn(x, task=0), first)


# ------------------------------------------------- item 12: a task with no capacity left
@pytest.mark.parametrize(
    ("method", "options", "hint"),
    [
        ("cpg", {"cpg_train_acc": 100.0}, "--cpg-train-acc"),
        ("rmn", {}, "--rmn-budget"),
    ],
)
def test_cpg_and_rmn_stop_before_a_task_that_would_get_no_weight(method, options, hint) -> None:
    """CPG's reference rule keeps every weight of a task whose compacting keeps no round (a
    training accuracy never above cpg_train_acc), RMN's threshold rule every weight whose
    relevance the small L1 term left above 0.5: the next task would train at chance."""
    torch.manual_seed(0)
    seq = tiny_sequence(n_tasks=2, shape=(64,))
    sn, _, engine = make_engine(FCNet(64, [16, 12], 3, multi_head=True), seq, method, **options)
    engine.train_task(seq.tasks[0], 0)
    assert sn.free_weights == 0  # the rule took the whole network
    frozen = {n: layer.weight.detach().clone() for n, layer in sn.layers.items()}
    with pytest.raises(TrainingStopped, match=rf"task 1 .*no new weights.*{hint}"):
        engine.train_task(seq.tasks[1], 1)
    assert len(sn.masks) == 1
    assert all(torch.equal(sn.layers[n].weight, w) for n, w in frozen.items())


def test_a_tiny_alpha_asks_for_a_larger_one() -> None:
    seq = tiny_sequence(n_tasks=1, shape=(64,))
    _, _, engine = make_engine(FCNet(64, [16, 12], 3, multi_head=True), seq, "espn", alpha=1e-300)
    with pytest.raises(TrainingStopped, match="use a larger --alpha") as exc:
        engine.train_task(seq.tasks[0], 0)
    assert "smaller --alpha" not in str(exc.value)


# ------------------------------------------------------ item 13: inputs that cannot apply
def test_an_all_zero_pretrained_task_is_refused() -> None:
    sn = Supernet(FCNet(64, [16, 12], 3, multi_head=True), torch.zeros(2, 64))
    zeros = {k: torch.zeros(s) for k, s in expected_shapes(sn, 3).items()}
    with pytest.raises(PretrainedError, match="all zero"):
        adopt_pretrained(sn, zeros, 3)
    assert not sn.masks and sn.frozen_weights == 0


def test_init_weights_of_zeros_is_refused_by_the_cli(fake_mnist, fc_small_model, tmp_path):
    sn = espn.wrap(fc_small_model, torch.zeros(2, 1, 28, 28), n_classes=10, multi_head=False)
    zeros = {k: torch.zeros(s) for k, s in expected_shapes(sn, 10).items()}
    save_file(zeros, str(tmp_path / "zeros.safetensors"))
    argv = ["run", "--benchmark", "permuted-mnist", "--model", fc_small_model, "--tasks", "2"]
    argv += ["--epochs", "1,0,0", "--init-weights", str(tmp_path / "zeros.safetensors")]
    result = runner.invoke(app, [*argv, "--out", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and "all zero" in result.output


INAPPLICABLE = [
    (["--reference-size", "100", "--no-step-floor"], "reference_size"),
    (["--method", "cpg", "--cpg-stop", "goal", "--cpg-train-acc", "80"], "cpg_train_acc"),
    (["--model", "fc1024", "--stream-pruning", "coupled"], "stream_pruning"),
]


@pytest.mark.parametrize(("argv", "name"), INAPPLICABLE, ids=[n for _, n in INAPPLICABLE])
def test_options_that_cannot_apply_are_refused_by_the_cli(argv, name, tmp_path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["run", "--benchmark", "permuted-mnist", *argv, "--out", str(out), "--no-progress"]
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error:") and name in result.output
    assert not out.exists()  # refused before any work


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"reference_size": 100, "step_floor": False}, "reference_size"),
        ({"method": "cpg", "cpg_stop": "goal", "cpg_train_acc": 80.0}, "cpg_train_acc"),
        ({"model": "fc1024", "stream_pruning": "coupled"}, "stream_pruning"),
    ],
)
def test_options_that_cannot_apply_are_refused_by_espn_run(options, name, tmp_path) -> None:
    with pytest.raises(ConfigError, match=name):
        espn.run(benchmark="permuted-mnist", out=tmp_path / "run", **options)
    assert not (tmp_path / "run").exists()


def test_the_python_api_refuses_options_that_cannot_apply() -> None:
    with pytest.raises(MethodSettingError, match="cpg_train_acc applies to cpg_stop reference"):
        espn.create_method("cpg", cpg_stop="goal", cpg_train_acc=80.0)
    espn.create_method("cpg", cpg_stop="reference", cpg_train_acc=80.0)  # applies there
    with pytest.raises(ApiArgumentError, match="no residual stream"):
        learner(stream_pruning="coupled")


# -------------------------------------------------------------- item 16: raw errors
@pytest.mark.parametrize(
    ("option", "value"), [("lr", 1e308), ("finetune_lr", 1e39), ("weight_decay", 1e39)]
)
def test_floats_beyond_float32_are_refused_up_front(option, value, tmp_path) -> None:
    with pytest.raises(ConfigError, match=rf"{option} must be at most 3\.403e\+38"):
        espn.run(benchmark="permuted-mnist", out=tmp_path / "run", **{option: value})
    flag = "--" + option.replace("_", "-")
    result = runner.invoke(
        app,
        ["run", "--benchmark", "permuted-mnist", flag, repr(value), "--out", str(tmp_path / "r")],
    )
    assert result.exit_code == 2 and result.output.startswith(f"error: {option}")
    with pytest.raises(ApiArgumentError, match=option):
        learner(**{option: value})
    with pytest.raises(MethodSettingError, match="rmn_l1 must be at most"):
        espn.create_method("rmn", rmn_l1=1e39)


class Pair(nn.Module):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.body, self.out = mlp(), out

    def forward(self, x: torch.Tensor) -> object:
        logits = self.body(x)
        return (logits, x) if self.out == "tuple" else {"logits": logits}


def frozen_mlp() -> nn.Module:
    model = mlp()
    model[0].requires_grad_(False)
    return model


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Pair("tuple"), "forward\\(\\) returns a tuple, not one tensor of logits"),
        (lambda: Pair("dict"), "forward\\(\\) returns a dict"),
        (lambda: nn.Sequential(nn.Linear(16, 0), nn.ReLU(), nn.Linear(0, 3)), "out_features 0"),
        (lambda: mlp(n_out=0), "module '2' .* out_features 0"),
        (frozen_mlp, "parameter '0.weight' is frozen"),
    ],
    ids=["tuple", "dict", "empty-hidden", "empty-head", "frozen"],
)
def test_models_espn_cannot_use_are_refused_at_wrap(make, match) -> None:
    with pytest.raises(ModelShapeError, match=match):
        espn.wrap(make(), data()[0])


def test_empty_tensors_are_refused_as_empty() -> None:
    x, y = data()
    with pytest.raises(ApiArgumentError, match="train data holds no samples"):
        learner().learn((x[:0], y[:0]))


def test_an_endless_generator_is_refused_not_read_forever(monkeypatch) -> None:
    monkeypatch.setattr(tensors_module, "MAX_BATCHES", 50)
    x, y = data()
    with pytest.raises(ApiArgumentError, match="did not end within 50 batches"):
        learner().learn(itertools.repeat((x, y)))

    class Long:  # a sized iterable is judged by its length, before it is read
        def __len__(self) -> int:
            return 51

        def __iter__(self):
            raise AssertionError("read")

    with pytest.raises(ApiArgumentError, match="has 51 batches"):
        learner().learn(Long())
    learner().learn([(x, y)] * 50)  # up to the bound is fine


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_writing_into_proc_is_one_clear_error(tmp_path) -> None:
    cl = learner()
    cl.learn(data(), data(seed=1))
    with pytest.raises(ExportError, match="/proc/espn-test"):
        cl.export(0, "/proc/espn-test/model.pt2")
    with pytest.raises(EspnError, match="cannot create it"):
        cl.save("/proc/espn-test/run")


def test_create_method_refuses_with_an_espn_error_naming_accepted_values() -> None:
    with pytest.raises(MethodSettingError, match="one of: gradual, one-shot, got 'bogus'"):
        espn.create_method("packnet", packnet_prune="bogus")
    with pytest.raises(MethodSettingError, match=r"supsup_k must be in \(0, 0.5\]"):
        espn.create_method("supsup", supsup_k=0.8)
    assert issubclass(MethodSettingError, EspnError)


# ------------------------------------------------------ item 11: labels that skip classes
def test_labels_that_do_not_start_at_zero_are_refused_unless_the_head_is_given() -> None:
    x, y = data()
    with pytest.raises(ApiArgumentError, match=r"labels run 3\.\.5 but 0, 1, 2 never occur"):
        learner().learn((x, y + 3))
    with pytest.raises(ApiArgumentError, match=r"0, 1, 2, 3, 4 and 95 more never occur"):
        learner().learn((x, y + 100))
    cl = learner()
    cl.learn((x, y + 3), n_classes=6)  # asked for: a 6-way head
    assert cl.report()[0]["n_classes"] == 6
    cl.learn((x, y))  # labels 0..2: a 3-way head, as inferred
    assert cl.report()[1]["n_classes"] == 3
