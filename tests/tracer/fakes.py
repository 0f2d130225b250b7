"""Fakes for the CUDA paths, which cannot run on this CPU-only machine, and a host clock that
moves only when a test says (``FakeClock``).

FakeEvent behaves like torch.cuda.Event(enable_timing=True): record() stamps it, query() turns
True only once the "device" has caught up (a few polls later), elapsed_time() is in ms. Its
stamps are real time, or a fake clock's (``FakeEventLog.now``).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from traceml_ci.tracer.clocks import HostClock


class FakeDevice:
    def __init__(self, type_: str = "cuda", index: int = 0) -> None:
        self.type = type_
        self.index = index

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


class FakeEventLog:
    """One in-order "stream": the device runs ``lag_records`` events behind the host, so an
    event completes once that many later events were recorded (or a synchronize reached it)."""

    def __init__(self, lag_records: int = 30) -> None:
        self.lag_records = lag_records
        #: What stamps an event (ns): ``time.perf_counter_ns``, or a ``FakeClock``'s ``mark``.
        self.now: Any = None
        self.created = 0
        self.records = 0
        self.queries = 0
        self.syncs = 0
        self.synced_upto = 0

    def factory(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, log: FakeEventLog) -> None:
        self.log = log
        self.t_ns: int | None = None
        self.seq = 0

    def record(self, stream: Any = None) -> None:
        self.log.records += 1
        self.seq = self.log.records
        self.t_ns = (self.log.now or time.perf_counter_ns)()

    def _done(self) -> bool:
        log = self.log
        return log.records - self.seq >= log.lag_records or self.seq <= log.synced_upto

    def query(self) -> bool:
        self.log.queries += 1
        return self._done()

    def synchronize(self) -> None:
        self.log.syncs += 1
        self.log.synced_upto = max(self.log.synced_upto, self.seq)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t_ns is not None and end.t_ns is not None, "event never recorded"
        assert self._done() and end._done(), "elapsed_time on a pending event"
        return (end.t_ns - self.t_ns) / 1e6


class FakeCudaMemory:
    """Stands in for CudaMemory: per-step peaks from a script of values."""

    def __init__(self, allocated_mb: float, reserved_mb: float, growth_mb: float = 0.0) -> None:
        self.allocated_mb = allocated_mb
        self.reserved_mb = reserved_mb
        self.growth_mb = growth_mb
        self.reads = 0

    def read_and_reset(self) -> tuple[float, float]:
        self.reads += 1
        grown = self.growth_mb * self.reads
        return self.allocated_mb + grown, self.reserved_mb + grown

    def counters(self) -> tuple[int, int]:
        return 2, 0

    def total_mb(self) -> float:
        return 80_000.0


def fake_torch_for_memory(stats: dict[str, Any]) -> Any:
    """A torch-like namespace with the allocator calls CudaMemory makes."""
    calls = SimpleNamespace(reset=0, stats=0)

    def memory_stats(index: int) -> dict[str, Any]:
        calls.stats += 1
        return stats

    def reset(index: int) -> None:
        calls.reset += 1

    torch = SimpleNamespace(
        _C=SimpleNamespace(_cuda_memoryStats=memory_stats),
        cuda=SimpleNamespace(
            reset_peak_memory_stats=reset,
            get_device_properties=lambda i: SimpleNamespace(total_memory=16 * 2**30),
        ),
    )
    return torch, calls


class FakeClock(HostClock):
    """A host clock that moves only when told: ``advance(us)`` moves it on by that many
    microseconds. Hand it to a tracer as its clock factory (``clock=fake``: calling it gives
    itself), and spend "time" in the loop with ``advance`` instead of spinning: every phase and
    step is then known to the nanosecond, whatever the machine's load."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns
        super().__init__(self._now)

    def _now(self) -> int:
        return self.now_ns

    def advance(self, us: float) -> None:
        self.now_ns += round(us * 1000)

    def __call__(self) -> FakeClock:
        return self


class FakeWait:
    """Stands in for the module sampler's ``ThreadWait`` (the thread's runqueue wait, read from
    schedstat): ns "waited for a CPU", moving only on ``advance(us)``. Module samples on a fake
    clock must not subtract the real preemptions of a loaded machine from fake intervals; a
    test that wants a preemption advances both (test_module_uniform.Block)."""

    def __init__(self) -> None:
        self.waited_ns = 0
        #: False: no schedstats (``read`` gives None), as on a kernel without them.
        self.available = True

    def read(self) -> int | None:
        return self.waited_ns if self.available else None

    def advance(self, us: float) -> None:
        self.waited_ns += round(us * 1000)

    def close(self) -> None:
        pass
