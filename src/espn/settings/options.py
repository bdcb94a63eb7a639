"""Settings a method (or a pruner it uses) declares for itself: one declaration gives the CLI
flag, the validation and the entry in a run's configuration."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: the value types an option may take
OPTION_TYPES = (float, int, str, bool)
#: the largest magnitude of a float option: the methods compute in float32
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class Option:
    """One setting of a method, e.g. ``Option("supsup_k", float, 0.5, "...", low=0,
    low_open=True, high=1)``.

    ``low``/``high`` bound a number (``low_open``/``high_open``: the bound itself is
    excluded), ``choices`` list the accepted strings; ``unit`` follows the range in
    messages (``"accuracy points"``). ``count`` > 0 makes it a tuple of that many values,
    each bounded so (``words`` says what it holds, ``form`` how the command line writes
    it); ``optional``: None is accepted (unset). The CLI flag is ``--name-with-dashes``.
    """

    name: str
    type: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    unit: str = ""
    count: int = 0
    form: str = ""
    words: str = ""
    optional: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name != self.name.lower():
            raise ValueError(f"option name {self.name!r} must be a lower-case Python identifier")
        if self.type not in OPTION_TYPES:
            accepted = ", ".join(t.__name__ for t in OPTION_TYPES)
            raise ValueError(f"option {self.name!r}: type {self.type!r} is not one of {accepted}")
        self.check(self.default)  # a declaration whose default is refused is a bug

    def accepted(self) -> str:
        """What the option accepts, in words: ``in (0, 1]``, ``>= 0``, ``one of: a, b``."""
        if self.choices:
            text = "one of: " + ", ".join(self.choices)
        elif self.low is not None and self.high is not None:
            text = (
                f"in {'(' if self.low_open else '['}{_number(self.low)}, "
                f"{_number(self.high)}{')' if self.high_open else ']'}"
            )
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {_number(self.low)}"
        elif self.high is not None:
            text = f"{'<' if self.high_open else '<='} {_number(self.high)}"
        else:
            text = {float: "a finite number", int: "an integer", bool: "true or false"}.get(
                self.type, "a string"
            )
        return f"{text} ({self.unit})" if self.unit else text

    def check(self, value: Any) -> Any:
        """``value`` as the option's type, or ValueError naming it and what is accepted."""
        if value is None and self.optional:
            return None
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{self.name} must be a finite number, got {value!r}")
        if self.count:
            return self._check_tuple(value)
        typed = self._typed(value)
        if isinstance(typed, float) and abs(typed) > FLOAT32_MAX:
            raise ValueError(
                f"{self.name} must be at most {FLOAT32_MAX:.4g} in magnitude (methods compute "
                f"in float32), got {value!r}"
            )
        if typed is None or not self._in_range(typed):
            raise ValueError(f"{self.name} must be {self.accepted()}, got {value!r}")
        return typed

    def _check_tuple(self, value: Any) -> tuple[Any, ...]:
        """``value`` (a sequence, or the command line's ``"a,b"``) as a tuple of ``count``
        values, each checked as the option's type and bounds."""
        if isinstance(value, str):
            text = value
            try:
                value = tuple(self.type(p) for p in text.split(","))
            except ValueError:
                value = ()
            if len(value) != self.count:
                raise ValueError(f"--{self.name} must be {self.form}, got {text!r}")
        if not isinstance(value, list | tuple):
            raise ValueError(f"{self.name} must be {self.words}, got {value!r}")
        if len(value) != self.count:
            shown = ",".join(map(str, value))
            raise ValueError(f"{self.name} must be {self.words}, got {len(value)} ({shown})")
        typed = tuple(self._typed(p) for p in value)
        if any(t is None or not self._in_range(t) for t in typed):
            shown = ",".join(_number(v) if isinstance(v, float) else str(v) for v in value)
            raise ValueError(f"{self.name} must be {self.words}, got {shown}")
        return typed

    def _typed(self, value: Any) -> Any:
        if self.type is bool:
            return value if isinstance(value, bool) else None
        if isinstance(value, bool):  # JSON ``true`` is not a number
            return None
        if self.type is float and isinstance(value, int | float):
            return float(value) if math.isfinite(value) else None
        if self.type is int and isinstance(value, int):
            return value
        if self.type is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if self.type is str and isinstance(value, str):
            return value
        return None

    def _in_range(self, value: Any) -> bool:
        if self.choices:
            return value in self.choices
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (
            self.high is not None and (value > self.high or (self.high_open and value == self.high))
        )


def _number(value: float) -> str:
    """A bound as messages show it: an integer in full, a float short (``1e-06``)."""
    return str(value) if isinstance(value, int) else f"{value:g}"
