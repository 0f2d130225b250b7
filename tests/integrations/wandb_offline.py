"""Read an offline W&B run back: its transaction log (``run-<id>.wandb``), decoded record by
record with wandb's own protobuf types. wandb 0.31 ships no Python reader for it and writes no
``wandb-summary.json`` offline; the file is LevelDB's log format (32 KiB blocks of records with
a 7-byte header: CRC, length, type) after W&B's own 7-byte header."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> Iterator[bytes]:
    assert data[:4] == b":W&B", data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        chunk, pos = data[pos:pos + length], pos + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""
        else:  # zeroed padding to the end of the block
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0


@dataclass
class OfflineRun:
    """What an offline run recorded: history rows, the final summary, tags, artifacts."""

    run_id: str = ""
    name: str = ""
    project: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    artifacts: list[Any] = field(default_factory=list)
    exit_code: int | None = None


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_offline_run(run_dir: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = run_dir.glob("run-*.wandb")
    out = OfflineRun()
    for chunk in _chunks(log.read_bytes()):
        record = pb.Record()
        record.ParseFromString(chunk)
        kind = record.WhichOneof("record_type")
        if kind == "run":  # the first has it all; later ones (tags set) may carry only changes
            r = record.run
            out.run_id = r.run_id or out.run_id
            out.name = r.display_name or out.name
            out.project = r.project or out.project
            out.job_type = r.job_type or out.job_type
            out.tags = list(r.tags) or out.tags
        elif kind == "history":
            out.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                out.summary[_key(item)] = json.loads(item.value_json)
        elif kind == "artifact":
            out.artifacts.append(record.artifact)
        elif kind == "exit":
            out.exit_code = record.exit.exit_code
    return out
