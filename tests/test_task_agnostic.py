"""Prediction without the task (espn.inference): exact agreement with the task-given path,
one task per batch, SupSup's one-shot gradient, statistics stored with the checkpoint
(save, load, resume bit for bit), the exported task-agnostic model, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call
from typer.testing import CliRunner

import espn
from espn.api.experiment import run_experiment
from espn.cli.main import app
from espn.inference import (
    RULES,
    InferenceError,
    OutputRule,
    evaluate_task_agnostic,
    infer,
    task_statistics,
)
from espn.inference.export import export_task_agnostic
from espn.inference.oneshot import SupSupOneShot
from espn.inference.outputs import batched_states, head_name, task_outputs
from espn.inference.routing import OPTION_KEYS
from espn.inference.statistics import STAT_KEYS, entropy
from espn.registry import UnknownNameError
from espn.runs.config import make_config
from espn.supernet.layers import TaskHead
from helpers.deploy import Killed, kill_at_step, run_options

runner = CliRunner()
N_TASKS = 3


def _model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 4))


def _learner(method: str, **settings) -> espn.ContinualLearner:
    """Three 4-class tasks of noisy 8x8 prototypes, one epoch per phase."""
    torch.manual_seed(0)
    learner = espn.ContinualLearner(
        espn.wrap(_model(), torch.zeros(2, 1, 8, 8)), method, epochs=(1, 1, 1), **settings
    )
    for _ in range(N_TASKS):
        y = torch.randint(4, (300,))
        x = torch.randn(4, 1, 8, 8)[y] + 1.5 * torch.randn(300, 1, 8, 8)
        learner.learn((x[:200], y[:200]), test=(x[200:], y[200:]))
    return learner


@pytest.fixture(scope="module")
def learner() -> espn.ContinualLearner:
    return _learner("espn", gamma=0.5)


@pytest.fixture(scope="module")
def supsup() -> espn.ContinualLearner:
    return _learner("supsup")


def _inputs(learner: espn.ContinualLearner) -> Tensor:
    return torch.cat([t.test.x for t in learner.tasks if t is not None])


def _output_rules() -> list[str]:
    return [r for r in RULES if issubclass(RULES.get(r), OutputRule)]


@pytest.mark.parametrize("rule", _output_rules())
def test_prediction_equals_the_task_given_one_where_the_task_is_inferred(learner, rule):
    x = _inputs(learner)
    tasks = learner.infer_task(x, rule=rule)
    classes = learner.predict(x, rule=rule)
    assert tasks.shape == classes.shape == (len(x),)
    for t in range(N_TASKS):
        rows = tasks == t
        given = learner.predict(x, task=t)
        assert torch.equal(classes[rows], given[rows])
    assert len(tasks.unique()) > 1  # samples of different tasks: not one task for all


def test_supsup_oneshot_prediction_equals_the_task_given_one(supsup):
    x = _inputs(supsup)
    tasks = supsup.infer_task(x, rule="supsup-oneshot")
    classes = supsup.predict(x, rule="supsup-oneshot")
    for t in tasks.unique().tolist():
        rows = (tasks == t).nonzero().flatten()
        assert torch.equal(classes[rows], supsup.predict(x[rows], task=t))


@pytest.mark.parametrize("rule", ["entropy", "entropy-mahalanobis"])
def test_same_task_picks_the_lowest_summed_score_for_the_whole_batch(learner, rule):
    x = learner.tasks[1].test.x[:32]
    tasks = learner.infer_task(x, same_task=True, rule=rule)
    scores = infer(learner.supernet, x, rule).scores
    assert tasks.tolist() == [int(scores.sum(0).argmin())] * len(x)
    classes = learner.predict(x, same_task=True, rule=rule)
    assert torch.equal(classes, learner.predict(x, task=int(tasks[0])))


def test_oneshot_gradient_equals_the_superposed_network_s(supsup):
    """The rule's per-sample gradient equals the gradient of one sample's entropy through the
    network whose masks are the mixture sum_t alpha_t M_t (and heads sum_t alpha_t head_t)."""
    sn = supsup.supernet
    x = supsup.tasks[2].test.x[:3]
    got = SupSupOneShot().scores(sn, x)[0]
    sn.use_task(0)
    sn.eval()
    for n in range(len(x)):
        alpha = torch.full((N_TASKS,), 1.0 / N_TASKS, requires_grad=True)
        tensors = {}
        for name in sn.layers:
            masks = torch.stack([m.weight_mask(name, "cpu").float() for m in sn.masks])
            tensors[f"{name}.weight_mask"] = (alpha[:, None, None] * masks).sum(0)
        for name, m in sn.task_modules.items():
            if isinstance(m, TaskHead):
                for key in ("weight", "bias"):
                    values = torch.stack([t.state[f"{name}.{key}"] for t in sn.masks])
                    shape = (-1,) + (1,) * (values.dim() - 1)
                    tensors[f"{name}.{key}"] = (alpha.view(shape) * values).sum(0)
        logits = functional_call(sn.model, tensors, (x[n : n + 1],))
        (want,) = torch.autograd.grad(entropy(logits).sum(), alpha)
        torch.testing.assert_close(got[n], want, rtol=1e-4, atol=1e-6)


def test_rules_that_cannot_run_are_refused_with_what_would_work(learner):
    x = _inputs(learner)[:4]
    with pytest.raises(UnknownNameError, match="entropy"):
        learner.predict(x, rule="nearest")
    with pytest.raises(InferenceError, match="SupSup"):
        learner.infer_task(x, rule="supsup-oneshot")
    saved = [m.stats for m in learner.supernet.masks]
    try:
        learner.supernet.masks[1].stats = {}
        with pytest.raises(InferenceError, match=r"tasks \[1\] have none"):
            learner.predict(x, rule="mahalanobis")
        assert learner.predict(x, rule="entropy").shape == (4,)  # stores nothing
    finally:
        for m, s in zip(learner.supernet.masks, saved, strict=True):
            m.stats = s


def test_task_given_logits_are_unchanged_by_inference_and_statistics(learner):
    x = _inputs(learner)
    sn = learner.supernet
    sn.eval()
    before = [sn(x, task=t).clone() for t in range(N_TASKS)]
    for rule in _output_rules():
        evaluate_task_agnostic(sn, learner.tasks, rule)
    task_statistics(sn, 0, learner.tasks[0])
    sn.eval()
    for t in range(N_TASKS):
        assert torch.equal(sn(x, task=t), before[t])


def test_statistics_are_recomputed_identically_and_survive_save_and_load(learner, tmp_path):
    for t in range(N_TASKS):
        again = task_statistics(learner.supernet, t, learner.tasks[t])
        stored = learner.supernet.masks[t].stats
        assert set(stored) == set(STAT_KEYS)
        assert all(torch.equal(again[k], v) for k, v in stored.items())
    loaded = espn.load(learner.save(tmp_path / "run"), model=_model())
    for t in range(N_TASKS):
        for k, v in learner.supernet.masks[t].stats.items():
            assert torch.equal(loaded.supernet.masks[t].stats[k], v)
    x = _inputs(learner)
    assert torch.equal(loaded.predict(x), learner.predict(x))
    state = learner.supernet.state_dict()  # the supernet's own state dict carries them too
    fresh = espn.wrap(_model(), torch.zeros(2, 1, 8, 8))
    fresh.load_state_dict(state)
    for t in range(N_TASKS):
        for k, v in learner.supernet.masks[t].stats.items():
            assert torch.equal(fresh.masks[t].stats[k], v)


@pytest.mark.parametrize("task_agnostic", [False, True])
def test_statistics_of_a_killed_and_resumed_run_equal_an_uninterrupted_run_s(
    fake_mnist, fc_test_model, tmp_path, monkeypatch, task_agnostic
):
    """With the ``task_agnostic`` option or without: the statistics the option adds survive
    the kill too."""
    keys = {*STAT_KEYS, *(OPTION_KEYS if task_agnostic else ())}
    options = {"task_agnostic": True} if task_agnostic else {}
    run_experiment(make_config(**run_options(tmp_path / "reference", **options)), progress=False)
    cfg = make_config(**run_options(tmp_path / "run", **options))
    with monkeypatch.context() as mp:
        kill_at_step(mp, 23)  # task 2, mid-way
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    run_experiment(cfg, progress=False, resume=True)
    want, got = espn.load(tmp_path / "reference"), espn.load(tmp_path / "run")
    for a, b in zip(want.supernet.masks, got.supernet.masks, strict=True):
        assert set(a.stats) == set(b.stats) == keys
        assert all(torch.equal(a.stats[k], b.stats[k]) for k in keys)


@pytest.mark.parametrize("rule", ["entropy-mahalanobis", "input-gaussian"])
def test_exported_task_agnostic_model_matches_predict(learner, tmp_path, rule):
    x = _inputs(learner)
    report = export_task_agnostic(
        learner.supernet, [x], tmp_path / "agnostic.pt2", rule, also_onnx=False
    )
    model = torch.export.load(str(tmp_path / "agnostic.pt2")).module()
    classes, tasks = model(x)
    assert report.ties == 0
    assert torch.equal(tasks, learner.infer_task(x, rule=rule))
    assert torch.equal(classes, learner.predict(x, rule=rule))
    assert json.loads((tmp_path / "agnostic.json").read_text())["checked_samples"] == len(x)


def test_oneshot_is_not_exported(supsup, tmp_path):
    with pytest.raises(espn.export.slim.ExportError, match="gradients"):
        export_task_agnostic(
            supsup.supernet, [_inputs(supsup)], tmp_path / "m.pt2", "supsup-oneshot"
        )


def test_cli_evaluate_stores_and_show_prints_task_agnostic_figures(cli_run: Path):
    result = runner.invoke(
        app, ["evaluate", "--run", str(cli_run), "--task-agnostic", "--rule", "entropy"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((cli_run / "results.json").read_text())["task_agnostic"]["entropy"]
    assert len(doc["tasks"]) == 3 and len(doc["confusion"]) == 3
    assert sum(map(sum, doc["confusion"])) == sum(r["test_samples"] for r in doc["tasks"])
    assert doc["average"]["given"] == pytest.approx(
        sum(json.loads((cli_run / "results.json").read_text())["final_accuracy"]) / 3
    )
    assert (cli_run / "task_confusion-entropy.png").stat().st_size > 0
    shown = runner.invoke(app, ["show", str(cli_run)])
    assert shown.exit_code == 0 and "rule entropy" in shown.output


def test_cli_refuses_an_unknown_rule_before_any_work(cli_run: Path):
    result = runner.invoke(
        app, ["evaluate", "--run", str(cli_run), "--task-agnostic", "--rule", "x"]
    )
    assert result.exit_code == 2 and "entropy-mahalanobis" in result.output
    result = runner.invoke(app, ["export", "--run", str(cli_run), "--out", "m.pt2"])
    assert result.exit_code == 2 and "--task-agnostic" in result.output


def test_evaluation_counts_a_sample_right_only_with_its_own_task_s_head(learner):
    """One head per task: a label means a class of one task only, so a sample classified by
    another task's head is wrong whatever that head says (counted independently here)."""
    doc = evaluate_task_agnostic(learner.supernet, learner.tasks, "entropy")
    for j, task in enumerate(learner.tasks):
        x, y = task.test.x, task.test.y
        got = infer(learner.supernet, x, "entropy")
        right = (got.tasks == j) & (got.classes == y)
        assert doc["tasks"][j]["per_sample"] == pytest.approx(100.0 * float(right.double().mean()))
        assert doc["tasks"][j]["given"] == learner.evaluate(j)


@pytest.mark.parametrize("method", ["learner", "supsup"])
def test_one_batched_pass_equals_the_per_task_passes(method, request):
    """Evaluation runs every sub-network as one batched pass: logits and features equal the
    per-task passes' bit for bit."""
    supernet = request.getfixturevalue(method).supernet
    x, tasks = _inputs(request.getfixturevalue(method)), range(N_TASKS)
    states = batched_states(supernet, tasks)
    assert states is not None and states["3.weight"].shape[0] == N_TASKS
    head = head_name(supernet)
    one, each = (
        task_outputs(supernet, x, tasks, head, states),
        task_outputs(supernet, x, tasks, head),
    )
    for a, b in zip(one.logits + one.features, each.logits + each.features, strict=True):
        assert torch.equal(a, b)
