"""A test marked ``@pytest.mark.traceml``: a fresh tracer around each repeat of the test body,
then the summaries gated. The front door drives it from ``pytest_runtest_call``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_plugin.gating import gate_summaries
from pytest_plugin.state import TracemlState
from pytest_plugin.summaries import read_summary

MARKER = "traceml"
MODES = ("auto", "manual")


@dataclass(frozen=True)
class MarkerArgs:
    """``@pytest.mark.traceml(warmup_steps=5, max_steps=None, key=None, mode="auto")``."""

    warmup_steps: int | None = None
    max_steps: int | None = None
    key: str | None = None
    mode: str = "auto"


def marker_args(marker: Any) -> MarkerArgs:
    """Check the marker's arguments; a mistake fails the test with one clear line."""
    __tracebackhide__ = True
    where = "@pytest.mark.traceml"
    if marker.args:
        pytest.fail(f"{where} takes keyword arguments only (warmup_steps, max_steps, key, mode)",
                    pytrace=False)
    known = {"warmup_steps", "max_steps", "key", "mode"}
    unknown = sorted(set(marker.kwargs) - known)
    if unknown:
        pytest.fail(f"{where}: unknown argument(s) {', '.join(unknown)}; "
                    f"expected some of {', '.join(sorted(known))}", pytrace=False)
    kw = dict(marker.kwargs)
    for name, least in (("warmup_steps", 0), ("max_steps", 1)):
        value = kw.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < least):
            pytest.fail(f"{where}: {name} must be an integer >= {least}, not {value!r}",
                        pytrace=False)
    key = kw.get("key")
    if key is not None and (not isinstance(key, str) or not key):
        pytest.fail(f"{where}: key must be a non-empty string, not {key!r}", pytrace=False)
    mode = kw.get("mode", "auto")
    if mode not in MODES:
        pytest.fail(f"{where}: mode must be one of {MODES}, not {mode!r}", pytrace=False)
    return MarkerArgs(kw.get("warmup_steps"), kw.get("max_steps"), key, mode)


class MarkedRun:
    """The tracer(s) of one marked test. ``tracer`` is the live one while the body runs."""

    def __init__(self, item: pytest.Item, args: MarkerArgs, state: TracemlState) -> None:
        self.item = item
        self.args = args
        self.state = state
        self.key = args.key or item.nodeid
        self.repeats = state.options.runs_per_test
        self.docs: list[dict[str, Any]] = []
        self.tracer: Any = None
        self._out: Path | None = None

    @classmethod
    def begin(cls, item: pytest.Item, marker: Any, state: TracemlState) -> MarkedRun:
        __tracebackhide__ = True
        run = cls(item, marker_args(marker), state)
        clash = state.key_clash(run.key, item.nodeid)
        if clash:
            pytest.fail(clash, pytrace=False)
        return run

    def _config(self, index: int) -> Any:
        from traceml_ci.tracer.config import TracerConfig

        if self._out is None:
            self._out = self.state.out_dir(self.item.nodeid)
        a = self.args
        locked = {"out_dir", "run_name"}
        if a.warmup_steps is not None:
            locked.add("warmup_steps")
        options: dict[str, Any] = dict(
            mode=a.mode,
            out_dir=self._out / f"repeat-{index}" if self.repeats > 1 or index else self._out,
            run_name=self.key,
            max_steps=a.max_steps,
            locked=frozenset(locked),
            # In-process tests are gated, not watched: no snapshot thread beside the test body.
            live=False,
            profile_steps=0,  # only the profiled re-run profiles (``profiled``)
            # A default: a test body's own init(module_sample_s=...) still wins.
            module_sample_s=self.state.options.module_sample_s,
            # The counters' file:line sites, relative to pytest's rootdir, as its node ids are.
            root_dir=self.item.config.rootpath,
        )
        if a.warmup_steps is not None:
            options["warmup_steps"] = a.warmup_steps
        return TracerConfig(**options)

    @contextmanager
    def repeat(self) -> Iterator[Any]:
        """A fresh tracer around one run of the test body; its summary is kept if it passes."""
        __tracebackhide__ = True
        from traceml_ci.tracer import api
        from traceml_ci.tracer.lifecycle import status_for_exception

        tracer = api.start(self._config(len(self.docs)), at_exit=False)
        self.tracer = tracer
        ended_by: type[BaseException] | None = None
        try:
            yield tracer
        except BaseException as exc:  # Ctrl-C: interrupted, not crashed
            ended_by = type(exc)
            raise
        finally:
            try:
                path = tracer.finish(None if ended_by is None
                                     else status_for_exception(ended_by))
            finally:
                api.stop()
                self.tracer = None
        if path is None:
            pytest.fail("traceml: the tracer could not write its summary (see the warning on "
                        "stderr)", pytrace=False)
        self.docs.append(read_summary(path))

    def finish_now(self) -> dict[str, Any]:
        """Finish the live tracer early (the ``traceml`` fixture's ``finish()``); returns its
        summary document. The repeat then keeps this summary."""
        __tracebackhide__ = True
        tracer = self.tracer
        if tracer is None:
            pytest.fail("traceml.finish(): no tracer is running", pytrace=False)
        path = tracer.finish()
        if path is None:
            pytest.fail("traceml: the tracer could not write its summary", pytrace=False)
        return read_summary(path)

    def gate(self, rerun: Callable[[], Any]) -> None:
        """Gate the runs so far; ``rerun()`` runs the test body once more (confirmation)."""
        __tracebackhide__ = True

        def one_more() -> dict[str, Any]:
            with self.repeat():
                rerun()
            return self.docs[-1]

        def profiled(out: Path, steps: int) -> None:
            self.profiled(out, steps, rerun)

        gate_summaries(self.state, nodeid=self.item.nodeid, key=self.key, docs=self.docs,
                       rerun=one_more, profile=profiled)

    def profiled(self, out: Path, steps: int, rerun: Callable[[], Any]) -> None:
        """Run the test body once more with ``steps`` steps profiled, its files under ``out``.
        Its summary is neither kept nor gated (the profiler's overhead is in it)."""
        from dataclasses import replace

        from traceml_ci.tracer import api

        config = replace(self._config(len(self.docs)), out_dir=out, profile_steps=steps)
        tracer = api.start(config, at_exit=False)
        self.tracer = tracer
        try:
            rerun()
        finally:
            try:
                tracer.finish()
            finally:
                api.stop()
                self.tracer = None
