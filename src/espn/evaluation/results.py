"""Reading a run's ``results.json`` back, checked against the layout ``run_experiment`` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from espn.errors import EspnError
from espn.utils.documents import describe_errors
from espn.utils.io import JsonFileError, read_json

RESULTS = "results.json"
Number = int | float


class ResultsError(EspnError, ValueError):
    """A results.json is unreadable or not of the layout espn writes; the message says why."""


class Results(BaseModel):
    """The fields of results.json that ``show``, ``evaluate`` and ``export`` read."""

    model_config = ConfigDict(extra="allow", strict=True, protected_namespaces=())

    config: dict[str, Any]
    task_names: list[str]
    accuracy_matrix: list[list[Number] | None]  # null: a row --eval-every skipped
    final_accuracy: list[Number]
    average_accuracy: Number | None
    complete: bool
    flops: list[Number] = Field(default_factory=list)
    flops_ratio: list[Number] = Field(default_factory=list)
    new_weights: list[int] = Field(default_factory=list)
    weight_budget: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_entry_per_task(self) -> Results:
        n = len(self.task_names)
        keys = ["flops", "flops_ratio", "new_weights", "weight_budget"]
        if any(row is not None for row in self.accuracy_matrix) or self.final_accuracy:
            keys.append("final_accuracy")  # empty when no task had test data to measure
        for key in keys:
            if len(getattr(self, key)) != n:
                raise ValueError(f"{key} has {len(getattr(self, key))} entries for {n} tasks")
        return self


def read_results(run_dir: Path | str) -> dict[str, Any] | None:
    """``<run_dir>/results.json`` checked against :class:`Results`, or None if there is none."""
    path = Path(run_dir) / RESULTS
    if not path.is_file():
        return None
    try:
        doc = read_json(path)
    except JsonFileError as exc:
        raise ResultsError(str(exc)) from None
    if not isinstance(doc, dict):
        raise ResultsError(f"{path} is not an espn results.json (not a JSON object)")
    try:
        Results.model_validate(doc)
    except ValidationError as exc:
        what = describe_errors(exc, "document", limit=1)
        raise ResultsError(f"{path} is not an espn results.json ({what})") from None
    return doc
