"""Training-set sizes per task (``--train-sizes``): a list, one per task, or a geometric rule."""

from __future__ import annotations

from typing import Any

from espn.settings.training import MAX_COUNT

TRAIN_SIZES_HELP = (
    "comma-separated sizes, one per task (e.g. 2500,2500,100), or geometric:N1:N2 "
    "(task 1 gets N1, the last N2, geometric in between)"
)


def normalise_train_sizes(value: Any) -> str:
    """``train_sizes`` as given (a list of counts or a string), checked and written as the
    canonical string ``"2500,2500,100"`` or ``"geometric:N1:N2"``."""
    if isinstance(value, list | tuple):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError(f"train_sizes must be {TRAIN_SIZES_HELP}, got {value!r}")
        value = ",".join(str(v) for v in value)
    if not isinstance(value, str):
        raise ValueError(f"train_sizes must be {TRAIN_SIZES_HELP}, got {value!r}")
    text = value.replace(" ", "")
    rule = text.startswith("geometric:")
    parts = text.removeprefix("geometric:").split(":" if rule else ",")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if not sizes or (rule and len(sizes) != 2):
        raise ValueError(f"train_sizes must be {TRAIN_SIZES_HELP}, got {value!r}")
    bad = [n for n in sizes if not 1 <= n <= MAX_COUNT]
    if bad:
        raise ValueError(f"train_sizes: every size must be in [1, {MAX_COUNT}], got {bad[0]}")
    return ("geometric:" if rule else "") + (":" if rule else ",").join(map(str, sizes))


def resolve_train_sizes(text: str, n_tasks: int) -> list[int]:
    """Per-task sizes of a canonical ``train_sizes`` string for ``n_tasks`` tasks: the list
    itself (one entry per task), or N1 * (N2/N1)^(t/(n-1)) rounded for ``geometric:N1:N2``."""
    if text.startswith("geometric:"):
        first, last = (int(v) for v in text.removeprefix("geometric:").split(":"))
        if n_tasks == 1:
            return [first]
        ratio = last / first
        return [max(1, round(first * ratio ** (t / (n_tasks - 1)))) for t in range(n_tasks)]
    sizes = [int(v) for v in text.split(",")]
    if len(sizes) != n_tasks:
        raise ValueError(
            f"train_sizes lists {len(sizes)} size(s) but the run has {n_tasks} task(s); "
            "give one size per task, or a rule such as geometric:N1:N2"
        )
    return sizes
