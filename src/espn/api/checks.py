"""The Python API's arguments, checked at the door before anything is built or trained: data,
models and paths here (the training settings by :func:`espn.runs.config.make_config`, as a run's
are); every refusal an :class:`ApiArgumentError` naming the argument."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from espn.errors import EspnError
from espn.runs.config import DEVICE, ConfigError
from espn.utils.io import os_error_text
from espn.utils.limits import MAX_CLASSES


class ApiArgumentError(EspnError, ValueError):
    """An argument of the Python API is not accepted; the message names it and says why."""


class LearnerError(EspnError, ValueError):
    """A learner cannot do what was asked; the message says why and what would work."""


def fail(argument: str, what: str) -> ApiArgumentError:
    """The error for ``argument``: ``argument: what`` on one line."""
    return ApiArgumentError(" ".join(f"{argument}: {what}".split()))


#: errors a model or a data set raises on input it cannot take (timm asserts its input size)
_MODEL_ERRORS = (RuntimeError, ValueError, TypeError, LookupError, AttributeError, AssertionError)


@contextmanager
def about(argument: str, context: str = "", test_argument: str | None = None) -> Iterator[None]:
    """Within: an error that is not espn's own becomes one line naming ``argument`` (and
    ``context``); a data error is named for ``test_argument`` where it is about the test split."""
    from espn.data.tensors import TaskDataError
    from espn.methods.base import MethodSettingError

    try:
        yield
    except TaskDataError as exc:  # "task 0: test data: ..." from learn(data, test)
        message = str(exc)
        named = test_argument if test_argument and ": test data" in message else argument
        raise fail(named, message) from None
    except MethodSettingError as exc:  # create_method's words, named for the argument
        raise fail(argument, str(exc)) from None
    except EspnError:
        raise
    except _MODEL_ERRORS as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise fail(argument, f"{context}{first[:300]}") from None


def check_learner(supernet: Any, device: Any) -> None:
    """``ContinualLearner``'s supernet and device (its settings are checked as a run's are, once,
    when its configuration is made)."""
    from espn.runs.preflight import check_device
    from espn.supernet.supernet import Supernet

    if not isinstance(supernet, Supernet):
        raise fail(
            "supernet",
            f"expected an espn Supernet (espn.wrap(model, example_input)), got "
            f"{type(supernet).__name__}",
        )
    if device is None:
        return
    if not isinstance(device, str | torch.device) or not DEVICE.fullmatch(str(device)):
        raise fail("device", f"unknown device {device!r}; choose 'cpu', 'cuda' or 'cuda:N'")
    try:
        check_device(str(device))
    except ConfigError as exc:
        raise ApiArgumentError(str(exc)) from None


#: the input dtypes a model may take, as the messages describe them
INPUT_DTYPES = {
    torch.float32: "float32 (convert them with x.float(), scaled as in training)",
    torch.int64: "int64 token ids (for a model whose first layer is an nn.Embedding)",
}


def check_example(model: Any, example_input: Any) -> None:
    """``wrap``'s model (a module, name or factory) and example batch."""
    if not (isinstance(model, nn.Module | str) or callable(model)):
        raise fail(
            "model",
            f"expected an nn.Module, a model name, a class or factory, got {type(model).__name__}",
        )
    if isinstance(model, nn.Module) and any(p.is_meta for p in model.parameters()):
        raise fail(
            "model",
            "its parameters are on the meta device; materialise them first "
            "(model.to_empty(device='cpu') and initialise)",
        )
    check_inputs(example_input, "example_input")
    if len(example_input) == 0:
        raise fail("example_input", "is an empty batch; give at least one sample")


def check_inputs(
    x: Any, argument: str, shape: tuple[int, ...] | None = None, dtype: torch.dtype | None = None
) -> None:
    """Model inputs: a finite tensor ``[N, *shape]`` of ``dtype`` (default: either of
    :data:`INPUT_DTYPES`, for ``wrap``'s example)."""
    if not isinstance(x, Tensor):
        raise fail(argument, f"expected a tensor of inputs [N, ...], got {type(x).__name__}")
    if x.dim() < 2:
        raise fail(argument, f"expected inputs of shape [N, ...], got shape {list(x.shape)}")
    accepted = INPUT_DTYPES if dtype is None else (dtype,)
    if x.dtype not in accepted:
        want = " or ".join(INPUT_DTYPES[d] for d in accepted)
        got = str(x.dtype).removeprefix("torch.")
        raise fail(argument, f"inputs must be {want}, got {got}")
    if x.device.type == "meta":
        raise fail(argument, "inputs are on the meta device; give real tensors")
    if not bool(torch.isfinite(x).all()):
        raise fail(argument, "inputs hold NaN or infinite values")
    if shape is not None and tuple(x.shape[1:]) != tuple(shape):
        raise fail(
            argument,
            f"inputs of shape {list(x.shape[1:])} per sample, the supernet takes {list(shape)}",
        )


def check_data_given(data: Any, argument: str) -> None:
    """Refuse ``None`` where data are needed, naming the argument."""
    if data is None:
        raise fail(argument, "no data: give (x, y) tensors or an iterable of (x, y) batches")


def check_classes(n_classes: Any, argument: str = "n_classes") -> None:
    """A class count: an int in [1, MAX_CLASSES] (labels define it when not given)."""
    if isinstance(n_classes, bool) or not isinstance(n_classes, int):
        raise fail(argument, f"must be an int, got {n_classes!r}")
    if not 1 <= n_classes <= MAX_CLASSES:
        raise fail(
            argument,
            f"must be in [1, {MAX_CLASSES}], got {n_classes} (labels are class indices "
            "0..n_classes-1)",
        )


def check_task(task: Any, learned: int) -> None:
    """A learned task's index: an int in ``0..learned-1``."""
    if isinstance(task, bool) or not isinstance(task, int):
        raise fail("task", f"must be a task index (int), got {task!r}")
    if not 0 <= task < learned:
        which = f"tasks 0..{learned - 1}" if learned else "no task is learned yet"
        raise fail("task", f"task {task} is not learned ({which})")


def check_name(name: Any) -> None:
    """A task's name: a string or None."""
    if name is not None and not isinstance(name, str):
        raise fail("name", f"must be a string, got {type(name).__name__}")


def check_bool(value: Any, argument: str) -> None:
    """A flag: True or False only (``"yes"``, 1 are refused, not read as true)."""
    if not isinstance(value, bool):
        raise fail(argument, f"must be True or False, got {value!r}")


def check_save_path(path: Any) -> Path:
    """A directory ``save`` can write: named (not ''), creatable and writable."""
    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise fail("path", f"give the directory to save the run in, got {path!r}")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise fail("path", f"{path} is a file, not a directory")
    parent = next((p for p in path.absolute().parents if p.exists()), Path("/"))
    if not parent.is_dir():
        raise fail("path", f"{path}: {parent} is a file, not a directory")
    where = path if path.exists() else parent
    if not os.access(where, os.W_OK | os.X_OK):
        raise fail("path", f"{path}: cannot write into {where} (permission denied)")
    try:  # access() says yes to root on read-only places such as /proc: try
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail("path", f"{path}: cannot create it ({os_error_text(exc)})") from None
    return path


def check_export_path(path: Any) -> None:
    """An export file name: a str or path (its suffix and directory are checked by export)."""
    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise fail("path", f"give a file name ending in .pt2 or .onnx, got {path!r}")


def check_callbacks(callbacks: Any) -> list[Any]:
    """``callbacks``: an iterable (not a string) of Callback objects."""
    from espn.training.callbacks import Callback

    if isinstance(callbacks, Callback) or not _iterable(callbacks):
        raise fail(
            "callbacks",
            f"expected a list of Callback objects, got {type(callbacks).__name__}"
            + ("; give it in a list: callbacks=[...]" if isinstance(callbacks, Callback) else ""),
        )
    given = list(callbacks)
    for k, item in enumerate(given):
        _not_a_class(item, f"callbacks[{k}]")
        if not isinstance(item, Callback):
            raise fail(f"callbacks[{k}]", f"expected a Callback object, got {type(item).__name__}")
    return given


def check_loggers(loggers: Any, log_every: Any) -> list[Any]:
    """``loggers``: logger names (comma-separated in one string, or a list) and
    :class:`~espn.training.callbacks.Callback` objects; ``log_every`` only with a name."""
    from espn.training.callbacks import Callback
    from espn.training.loggers import logging_options

    if isinstance(loggers, Callback) or not (isinstance(loggers, str) or _iterable(loggers)):
        raise fail(
            "loggers",
            f"expected logger names or a list of names and Callback objects, got "
            f"{type(loggers).__name__}",
        )
    given = loggers.split(",") if isinstance(loggers, str) else list(loggers)
    for k, item in enumerate(given):
        _not_a_class(item, f"loggers[{k}]")
    logging_options(given, log_every)
    return [x for x in given if not isinstance(x, str) or x.strip()]


def _not_a_class(item: Any, argument: str) -> None:
    """Refuse a callback class given where an object of it is wanted."""
    from espn.training.callbacks import Callback

    if isinstance(item, type) and issubclass(item, Callback):
        raise fail(argument, f"is the class {item.__name__}; give an object of it")


def _iterable(value: Any) -> bool:
    """Whether ``value`` is a collection of items (a list, tuple, ...; not a string)."""
    try:
        iter(value)
    except TypeError:
        return False
    return not isinstance(value, str | bytes)
