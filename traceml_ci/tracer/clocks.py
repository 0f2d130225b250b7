"""Clocks for phase boundaries.

HostClock: ``time.perf_counter_ns`` -- exact on CPU, where ops run synchronously.
DeviceEventClock: events recorded on the device's current stream at each boundary, resolved
lazily with ``query()`` a few steps later: the host never waits for the device.

A ``Tracer`` is given a ``ClockFactory`` for its host clock (default ``HostClock``): tests hand
it a fake clock that moves only when told, so the tracer's logic is checked in exact
microseconds and only the attribution tests spin real time against a stopwatch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class HostClock:
    kind = "host"

    def __init__(self, now: Callable[[], int] = time.perf_counter_ns) -> None:
        self.mark: Callable[[], Any] = now

    @staticmethod
    def elapsed_ms(t0: int, t1: int) -> float:
        return (t1 - t0) / 1e6

    @staticmethod
    def ready(t: Any) -> bool:
        return True

    def release(self, t: Any) -> None:  # host timestamps need no recycling
        pass

    def wait(self, t: Any) -> None:
        pass


#: Makes a tracer's host clock (called once, when the tracer starts).
ClockFactory = Callable[[], HostClock]


class DeviceEventClock:
    """Marks are timing events recorded on the current stream, taken from a reusable pool."""

    kind = "device_event"

    def __init__(self, event_factory: Callable[[], Any]) -> None:
        self._new = event_factory
        self._pool: list[Any] = []

    def mark(self) -> Any:
        ev = self._pool.pop() if self._pool else self._new()
        ev.record()
        return ev

    @staticmethod
    def elapsed_ms(t0: Any, t1: Any) -> float:
        return float(t0.elapsed_time(t1))

    @staticmethod
    def ready(t: Any) -> bool:
        return bool(t.query())

    def release(self, t: Any) -> None:
        if len(self._pool) < 4096:
            self._pool.append(t)

    @staticmethod
    def wait(t: Any) -> None:
        t.synchronize()


def device_event_factory(device: Any) -> Callable[[], Any] | None:
    """A factory of timing events for ``device`` (a torch.device), or None on CPU / no support."""
    import torch

    if device is None or device.type == "cpu":
        return None
    if device.type == "cuda":
        return lambda: torch.cuda.Event(enable_timing=True)
    event_cls = getattr(torch, "Event", None)
    if event_cls is None:
        return None
    return lambda: event_cls(device=device, enable_timing=True)
