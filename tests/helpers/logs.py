"""Reading back what the experiment loggers wrote: TensorBoard event files and offline W&B runs."""

from __future__ import annotations

import glob
import json
import struct
from pathlib import Path
from typing import Any


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in the event files of ``directory``: its (step, value) points."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tensorboard_texts(directory: Path, tag: str) -> list[tuple[int, str]]:
    """The (step, text) points of the text tag ``tag`` in ``directory``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory))
    acc.Reload()
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]


def wandb_run(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The history rows and the config of the one offline W&B run under ``run_dir`` (its ``.wandb`` record
    log: a 7-byte header, then 32 KiB blocks of records of a 7-byte header (checksum,
    length, kind: 1 whole, 2 first, 3 middle, 4 last) and a protobuf ``Record``)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, rows, config = 32768, 7, b"", [], {}
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # block padding
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            kind_of = record.WhichOneof("record_type")
            updates = {"config": record.config.update, "run": record.run.config.update}
            for item in updates.get(kind_of or "", []):
                config[item.key] = json.loads(item.value_json)
            if kind_of == "history":
                items = record.history.item
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
    return rows, config
