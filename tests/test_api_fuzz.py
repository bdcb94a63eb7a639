"""The Python API refuses bad input at the door: every case the fuzzing found, and a
property test over shapes, dtypes and values, end in an EspnError of one line that names the
bad argument (never torch's or Python's own error)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import espn
from espn.api.checks import MAX_CLASSES
from espn.errors import EspnError

SHAPE = (1, 4, 4)
#: a CUDA device this machine lacks (cuda:0 where CUDA is absent)
ABSENT_CUDA = f"cuda:{torch.cuda.device_count()}"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU())
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def data(seed: int = 0, n: int = 32, shape: tuple[int, ...] = SHAPE) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=gen), torch.randint(0, 3, (n,), generator=gen)


@pytest.fixture(scope="module")
def learned() -> espn.ContinualLearner:
    """A learner with one learned task (shared by the tests that only read it)."""
    learner = espn.ContinualLearner(
        espn.wrap(Net(), torch.zeros(2, *SHAPE)), epochs=(1, 1, 1), batch_size=16
    )
    learner.learn(data(0), test=data(1))
    return learner


def fresh() -> espn.ContinualLearner:
    return espn.ContinualLearner(espn.wrap(Net(), torch.zeros(2, *SHAPE)), epochs=(1, 1, 1))


def refused(call, argument: str) -> str:
    """Run ``call``; it must raise an EspnError of one line starting with ``argument:``."""
    with pytest.raises(EspnError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message, message
    assert message.startswith(f"{argument}:") or f" {argument} " in message, message
    return message


# ------------------------------------------------------------------ the fuzzing's cases
@pytest.mark.parametrize(
    ("kwargs", "argument", "words"),
    [
        ({"lr": -1}, "lr", "lr must be > 0, got -1"),
        ({"lr": math.nan}, "lr", "must be a finite number, got nan"),
        ({"batch_size": -5}, "batch_size", "batch_size must be >= 1, got -5"),
        ({"batch_size": 0}, "batch_size", "batch_size must be >= 1, got 0"),
        ({"seed": -1}, "seed", "seed must be in [0, 4294967295], got -1"),
        ({"device": ABSENT_CUDA}, "device", f"device '{ABSENT_CUDA}'"),
        ({"gamma": 2}, "gamma", "gamma must be in (0, 1], got 2"),
        ({"gamma": math.nan}, "gamma", "must be a finite number, got nan"),
        ({"epochs": (1, 1)}, "epochs", "epochs must be three non-negative counts"),
        ({"betas": (0.9, 2)}, "betas", "betas must be two numbers in [0, 1)"),
        ({"optimizer": "foo"}, "optimizer", "optimizer must be one of: sgd"),
        ({"no_such_setting": 1}, "settings", "unknown setting 'no_such_setting'"),
    ],
)
def test_learner_options_are_checked_as_the_cli_checks_them(kwargs, argument, words) -> None:
    sn = espn.wrap(Net(), torch.zeros(2, *SHAPE))
    assert words in refused(lambda: espn.ContinualLearner(sn, **kwargs), argument)


def test_a_plain_module_is_not_a_supernet() -> None:
    assert "espn.wrap" in refused(lambda: espn.ContinualLearner(Net()), "supernet")


@pytest.mark.parametrize(
    ("example", "argument"),
    [
        (None, "example_input"),
        ("x", "example_input"),
        (3, "example_input"),
        (torch.zeros(0, *SHAPE), "example_input"),
        (torch.zeros(2, 1, 5, 5), "example_input"),  # does not fit the model's first layer
        (torch.zeros(2, *SHAPE, dtype=torch.float64), "example_input"),
        (torch.zeros(2, *SHAPE, dtype=torch.uint8), "example_input"),
    ],
)
def test_wrap_refuses_bad_example_inputs(example, argument) -> None:
    refused(lambda: espn.wrap(Net(), example), argument)


def test_wrap_refuses_a_meta_device_model() -> None:
    with torch.device("meta"):
        model = Net()
    assert "meta device" in refused(lambda: espn.wrap(model, torch.zeros(2, *SHAPE)), "model")


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda lr: lr.learn(None), "data"),
        (lambda lr: lr.learn(data(0, shape=(1, 5, 5))), "data"),
        (lambda lr: lr.learn((data()[0].double(), data()[1])), "data"),
        (lambda lr: lr.learn((data()[0].to(torch.uint8), data()[1])), "data"),
        (lambda lr: lr.learn((data()[0], torch.full((32,), 10**9))), "data"),
        (lambda lr: lr.learn(data(), n_classes=10**7), "n_classes"),
        (lambda lr: lr.learn([data(0, 8), data(1, 8, (1, 5, 5))]), "data"),  # ragged batches
        (
            lambda lr: lr.learn(data(), test=(torch.full((8, *SHAPE), math.nan), data()[1][:8])),
            "test",
        ),
        (lambda lr: lr.learn(data(), name=5), "name"),
    ],
)
def test_learn_refuses_bad_data_before_training(call, argument) -> None:
    learner = fresh()
    refused(lambda: call(learner), argument)
    assert learner.supernet.masks == []


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda lr: lr.evaluate(5), "task"),
        (lambda lr: lr.evaluate("0"), "task"),
        (lambda lr: lr.evaluate(0, data(0, 8, (1, 5, 5))), "data"),
        (lambda lr: lr.export(3, "t.pt2"), "task"),
        (lambda lr: lr.export(0, 3), "path"),
        (lambda lr: lr.save(""), "path"),
        (lambda lr: lr.save(None), "path"),
    ],
)
def test_evaluate_export_save_refuse_bad_arguments(learned, call, argument) -> None:
    refused(lambda: call(learned), argument)


def test_save_into_a_read_only_or_impossible_place(learned, tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    refused(lambda: learned.save(tmp_path / "file" / "run"), "path")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        refused(lambda: learned.save(locked / "run"), "path")
    assert not any(Path.cwd().glob("checkpoint"))


# ------------------------------------------------------------------ property test
DTYPES = [torch.float32, torch.float64, torch.float16, torch.int64, torch.uint8, torch.bool]
VALUES = [0.0, 1.0, -1e30, math.nan, math.inf]


@st.composite
def inputs(draw):
    """A batch of any rank, size, dtype and value: mostly wrong, sometimes right."""
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=rank, max_size=rank)))
    if draw(st.booleans()):
        shape = (draw(st.integers(1, 6)), *SHAPE)
    dtype = draw(st.sampled_from(DTYPES))
    fill = draw(st.sampled_from(VALUES))
    x = torch.full(shape, fill) if shape else torch.tensor(fill)
    return (
        x.to(dtype)
        if not (
            dtype != torch.bool and dtype.is_floating_point is False and not math.isfinite(fill)
        )
        else x
    )


@st.composite
def labels(draw, n: int):
    kind = draw(st.sampled_from(["ok", "huge", "negative", "float", "short"]))
    if kind == "ok":
        return torch.randint(0, 3, (n,))
    if kind == "huge":
        return torch.full((n,), draw(st.integers(MAX_CLASSES, 10**12)))
    if kind == "negative":
        return torch.full((n,), -1)
    if kind == "float":
        return torch.zeros(n)
    return torch.zeros(max(n - 1, 0), dtype=torch.long)


FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _ok_or_named(call, arguments: tuple[str, ...]) -> None:
    try:
        call()
    except EspnError as exc:
        message = str(exc)
        assert "\n" not in message, message
        assert message.split(":")[0] in arguments, message
    # any other exception fails the test: it is not an EspnError


@FUZZ
@given(x=inputs())
def test_wrap_any_example_input(x) -> None:
    _ok_or_named(lambda: espn.wrap(Net(), x), ("example_input",))


@FUZZ
@given(x=inputs(), data_=st.data())
def test_learn_and_evaluate_any_data(learned, x, data_) -> None:
    y = data_.draw(labels(len(x) if x.dim() else 1))
    _ok_or_named(lambda: learned.evaluate(0, (x, y)), ("data",))
    _ok_or_named(lambda: fresh().learn((x, y), n_classes=None), ("data", "n_classes"))


@FUZZ
@given(
    lr=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5)),
    batch_size=st.one_of(st.none(), st.integers(-3, 3)),
    seed=st.integers(-(2**40), 2**40),
    gamma=st.floats(allow_nan=True, allow_infinity=True),
)
def test_learner_any_options(lr, batch_size, seed, gamma) -> None:
    sn = espn.wrap(Net(), torch.zeros(2, *SHAPE))
    _ok_or_named(
        lambda: espn.ContinualLearner(sn, lr=lr, batch_size=batch_size, seed=seed, gamma=gamma),
        ("lr", "batch_size", "seed", "gamma"),
    )
