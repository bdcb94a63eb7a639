"""One small model per construct the converter must follow (``helpers.constructs``), each
through benchmarks/model_matrix.py's check: wrapped, 2 tasks learned with a short last batch,
task 0's logits bit-identical after task 1, each task exported and run at batch 1 and 3, and
the export's FLOPs (``FlopCounterMode`` on the loaded program) equal to what espn reports."""

from __future__ import annotations

from pathlib import Path

import pytest

import espn
from helpers.constructs import CONSTRUCTS

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow  # about 20 s a model on 2 cores: two torch.export calls each
@pytest.mark.parametrize("construct", sorted(CONSTRUCTS))
def test_the_construct_works_end_to_end(construct: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import model_matrix

    make, example = CONSTRUCTS[construct]
    entry = model_matrix.Entry(construct, "construct", lambda: (make(), example))
    row = model_matrix.check(entry, model_matrix.Settings(per_task=40, timing_batches=[]))
    assert row["verdict"] == "works", f"{row['verdict']} at {row.get('stage')}: {row.get('reason')}"
    for task in row["tasks"]:
        assert 0 < task["measured_flops"] == task["reported_flops"] < row["dense_flops"]
        assert task["measured_ratio"] == pytest.approx(task["reported_ratio"], rel=0.01)


@pytest.mark.parametrize(
    ("construct", "groups", "concats"),
    [
        (
            "patch-attention",
            {"stem.0": 8, "local": 16, "attn.heads": 2, "proj.0": 8, "fusion.0": 8},
            {"cat(stem.0,proj.0)": ("stem.0", "proj.0")},
        ),
        ("linear-attention", {"stem.0": 1, "mlp.1": 64}, {}),
    ],
)
def test_mobilevit_blocks_are_pruned_where_a_cut_is_exact(
    construct: str, groups: dict[str, int], concats: dict[str, tuple[str, ...]]
) -> None:
    """MobileViT's block: every part pruned, its attention heads too, the fusion conv reading
    the block's input and the projection concatenated. MobileViTv2's: the residual stream
    (normalised by ``GroupNorm(1, C)``, over all its channels) and the qkv conv's output (split
    into a 1-channel query, keys and values) are one unit, kept whole; its MLP is pruned. (wrap
    checks espn's FLOPs, every sequence of a sample counted, against FlopCounterMode, and a
    random task's slim copy at batch 1 and 3.)"""
    make, example = CONSTRUCTS[construct]
    sn = espn.wrap(make(), example)
    assert sn.group_sizes == groups and sn.concats == concats
