"""One error base class: every user-fixable error is an EspnError, and the CLI's one
handler turns any of them into one line and exit status 2."""

import pytest
import typer

from espn.api.functions import LearnerError
from espn.checkpoint.format import CheckpointError
from espn.checkpoint.lock import RunLocked
from espn.data.sources import DatasetUnavailable
from espn.data.tensors import TaskDataError
from espn.errors import EspnError
from espn.evaluation.results import ResultsError
from espn.export.slim import ExportError
from espn.models.convert import ConvertError
from espn.models.reference import ModelReferenceError
from espn.registry import UnknownNameError
from espn.runs.config import ConfigError
from espn.settings.presets import PresetError
from espn.supernet.pretrained import PretrainedError
from espn.supernet.supernet import NothingToMask
from espn.sweep.spec import SweepError
from espn.theory.planted import TheoryConfigError
from espn.training.capacity import TrainingStopped
from espn.utils.commands import UserError, user_errors

ERRORS = [
    (CheckpointError, ValueError),
    (RunLocked, ValueError),
    (ConfigError, ValueError),
    (DatasetUnavailable, RuntimeError),
    (ResultsError, ValueError),
    (ExportError, ValueError),
    (ConvertError, ValueError),
    (PresetError, ValueError),
    (UnknownNameError, ValueError),
    (PretrainedError, ValueError),
    (TheoryConfigError, ValueError),
    (SweepError, ValueError),
    (TrainingStopped, RuntimeError),
    (UserError, ValueError),
    (TaskDataError, ValueError),
    (ModelReferenceError, ValueError),
    (LearnerError, ValueError),
    (NothingToMask, ValueError),
]


@pytest.mark.parametrize(("error", "standard"), ERRORS, ids=[e.__name__ for e, _ in ERRORS])
def test_every_user_error_is_an_espn_error_and_exits_2(error, standard, capsys):
    assert issubclass(error, EspnError) and issubclass(error, standard)

    @user_errors
    def command() -> None:
        raise error("bad value 7; accepted: 1..5")

    with pytest.raises(typer.Exit) as exc:
        command()
    assert exc.value.exit_code == 2
    assert capsys.readouterr().err.strip() == "error: bad value 7; accepted: 1..5"


def test_an_unexpected_error_is_reported_as_a_bug(capsys):
    @user_errors
    def command() -> None:
        raise ValueError("boom")

    with pytest.raises(typer.Exit) as exc:
        command()
    assert exc.value.exit_code == 1
    assert "unexpected ValueError: boom (a bug in espn" in capsys.readouterr().err
