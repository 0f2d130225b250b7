"""Distributed runs: each rank's summary gathered once, at finish, over torch.distributed; rank 0
writes the merged summary (summary/ranks.py), every rank its own ``final_summary.rank<N>.json``.

The gather runs over a small gloo group of our own, made right after the job's
``init_process_group`` (every rank makes it then, so making it cannot hang), with a bounded
timeout: gloo carries Python objects whatever the job's backend (NCCL cannot), and a rank that
died cannot hang the others' finish for longer than ``$TRACEML_CI_GATHER_TIMEOUT_S``
(30 s; ``config.gather_timeout_s``). Most scripts destroy
the process group before the interpreter exits, so ``destroy_process_group`` is wrapped to
finish the tracer first, while the group still exists.

Nothing here runs per step. Every failure degrades to per-rank files and one warning.
"""

from __future__ import annotations

import atexit
import functools
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from traceml_ci.tracer.config import gather_timeout_s


def _dist() -> Any:
    """torch.distributed when the script uses it (never imported on our account)."""
    if "torch.distributed" not in sys.modules:
        return None
    dist = sys.modules["torch.distributed"]
    try:
        return dist if dist.is_available() else None
    except Exception:
        return None


def parallelism(models: tuple[Any, ...]) -> str | None:
    """How the traced model is spread over ranks: "fsdp" (its collectives wait inside forward
    and backward), "ddp" (they wait inside backward), else None."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
        from torch.nn.parallel import DistributedDataParallel
    except Exception:
        return None
    found = None
    for model in models:
        try:
            for module in model.modules():
                if isinstance(module, (FSDPModule, FullyShardedDataParallel)):
                    return "fsdp"
                if isinstance(module, DistributedDataParallel):
                    found = "ddp"
        except Exception:
            continue
    return found


class RankGather:
    """Hooks ``init_process_group`` / ``destroy_process_group`` and gathers at finish.

    ``finish``: the tracer's finish, called before the job's group is destroyed. ``on_group``:
    called with ``torch.distributed`` once a process group is in use (the wait phase's
    collectives are timed from then on, tracer/waits.py)."""

    def __init__(
        self,
        finish: Callable[[], Any],
        warn: Callable[[str], None],
        on_group: Callable[[Any], None] | None = None,
    ) -> None:
        self._finish = finish
        self._warn = warn
        self._on_group = on_group
        #: A process group was in use while tracing: the summary has the wait phase.
        self.in_use = False
        self.group: Any = None
        self._originals: dict[str, Any] = {}
        self.backend: str | None = None

    # -- hooks -------------------------------------------------------------------------------
    def install(self) -> None:
        dist = _dist()
        if dist is None or self._originals:
            return
        init, destroy = dist.init_process_group, dist.destroy_process_group

        @functools.wraps(init)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            out = init(*args, **kwargs)
            self._make_group(dist)
            self._finish_before_torch_exits()
            return out

        @functools.wraps(destroy)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if not args and not kwargs.get("group"):  # the whole job's group, not a subgroup
                try:
                    self._finish()
                except Exception as exc:  # never into the user's code
                    self._warn(f"finishing before destroy_process_group failed ({exc!r})")
            return destroy(*args, **kwargs)

        self._originals = {"init_process_group": init, "destroy_process_group": destroy}
        dist.init_process_group = init_process_group
        dist.destroy_process_group = destroy_process_group
        if self.world_size(dist) > 1:  # the script initialised before tracing began
            self._make_group(dist)
            self._finish_before_torch_exits()

    def uninstall(self) -> None:
        dist = _dist()
        if dist is None:
            return
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals = {}

    def _finish_before_torch_exits(self) -> None:
        """A script that never destroys its group: torch tears the group down in an exit
        handler registered by ``init_process_group``. Exit handlers run last-registered first,
        so one registered after it finishes (and gathers) while the group still works."""
        def finish_at_exit() -> None:
            if self.world_size() > 1:
                try:
                    self._finish()
                except Exception as exc:
                    self._warn(f"finishing at exit failed ({exc!r})")

        atexit.register(finish_at_exit)

    def _make_group(self, dist: Any) -> None:
        self.in_use = True
        if self._on_group is not None:
            try:
                self._on_group(dist)
            except Exception as exc:
                self._warn(f"collectives not timed ({exc!r})")
        try:
            self.backend = str(dist.get_backend())
            self.group = dist.new_group(backend="gloo",
                                        timeout=timedelta(seconds=gather_timeout_s()))
        except Exception as exc:
            self.group = None
            self._warn(f"no group for the finish-time gather ({exc!r}); ranks keep their own "
                       "summaries")

    # -- finish ------------------------------------------------------------------------------
    @staticmethod
    def world_size(dist: Any = None) -> int:
        dist = dist or _dist()
        try:
            if dist is not None and dist.is_initialized():
                return int(dist.get_world_size())
        except Exception:
            pass
        return 1

    def gather(self, doc: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Every rank's summary dict, in rank order, on every rank; None when this is not a
        distributed run or the gather failed (then warned once)."""
        dist = _dist()
        world = self.world_size(dist)
        if world <= 1 or self.group is None:
            return None
        out: list[Any] = [None] * world
        try:
            dist.all_gather_object(out, doc, group=self.group)
        except Exception as exc:
            self._warn(f"gathering the ranks' summaries failed ({type(exc).__name__}: "
                       f"{str(exc)[:200]}); each rank keeps its own summary")
            return None
        finally:
            self._destroy_group(dist)
        return [d for d in out if isinstance(d, dict)]

    def _destroy_group(self, dist: Any) -> None:
        """Our group's worker threads must be joined before the interpreter exits: a group
        left to its destructor at exit aborts the process ("terminate called without an
        active exception")."""
        group, self.group = self.group, None
        destroy = self._originals.get("destroy_process_group", dist.destroy_process_group)
        try:
            destroy(group)
        except Exception:
            pass

    def nodes(self, docs: list[dict[str, Any]]) -> int | None:
        """Nodes in the job: torchrun's node ranks (GROUP_RANK), else distinct hosts."""
        for key in ("node_rank", "host"):
            seen = {(d.get("run") or {}).get(key) for d in docs}
            seen.discard(None)
            if seen:
                return len(seen)
        return None
