"""Who this process is in its run: rank, local rank, world size, node rank, host, pid, the
default run name, and the file names that follow from them. Parsed once, when a tracer starts
(``config.read_identity``: the environment a launcher such as torchrun set); everything in the
tracer asks the one ``Identity`` it was given.

Torch-free and cheap: the launcher side (``ranks_on_node.py``) names per-rank files with it too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceml_ci.summary.keys import SUMMARY_FILENAME


def rank_summary_name(rank: int) -> str:
    """The file each rank of a distributed run writes its own summary to."""
    return f"final_summary.rank{int(rank)}.json"


def _whole(value: str | None) -> int | None:
    """A launcher's number: None when missing, empty or unreadable (a tracer setting must never
    stop training)."""
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Identity:
    #: Global rank (``RANK``); 0 when not launched as one rank of many.
    rank: int = 0
    #: Processes in the job (``WORLD_SIZE``); 1 when not set.
    world_size: int = 1
    #: Rank on this node (``LOCAL_RANK``) and the node's rank (``GROUP_RANK``): None when the
    #: launcher did not say (a merged summary shows them as unknown).
    local_rank: int | None = None
    node_rank: int | None = None
    host: str = ""
    pid: int = 0
    #: The run's name unless ``init(run_name=...)`` gives one: the script's stem.
    script: str = "run"

    @classmethod
    def parse(cls, environ: Mapping[str, str], argv: Sequence[str], host: str,
              pid: int) -> Identity:
        rank = _whole(environ.get("RANK"))
        world = _whole(environ.get("WORLD_SIZE"))
        script = Path(argv[0]).stem if argv and argv[0] else ""
        return cls(
            rank=rank if rank is not None else 0,
            world_size=world if world is not None else 1,
            local_rank=_whole(environ.get("LOCAL_RANK")),
            node_rank=_whole(environ.get("GROUP_RANK")),
            host=host,
            pid=pid,
            script=script or "run",
        )

    def run_name(self, given: str | None) -> str:
        return given or self.script

    @property
    def summary_name(self) -> str:
        """Where this process's summary goes in the output folder: ``final_summary.json`` for
        rank 0, the rank's own file for any other (no gather: each rank keeps its own)."""
        return SUMMARY_FILENAME if self.rank == 0 else rank_summary_name(self.rank)

    @property
    def rank_summary_name(self) -> str:
        return rank_summary_name(self.rank)

    def placement(self) -> dict[str, Any]:
        """The ``run`` fields a distributed run's summaries add: where this rank ran."""
        return {"local_rank": self.local_rank, "node_rank": self.node_rank, "host": self.host}

    def snapshot_fields(self) -> dict[str, Any]:
        """The live snapshot's identity fields (a process no launcher placed is local rank 0)."""
        return {
            "rank": self.rank,
            "local_rank": self.local_rank if self.local_rank is not None else 0,
            "world_size": self.world_size,
            "host": self.host,
            "pid": self.pid,
        }
