"""The ``traceml`` fixture: the running test's tracer, its summary, and ``run_script``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_plugin.gating import gate_summaries
from pytest_plugin.state import TracemlState

#: item.stash slot of the MarkedRun of a marked test (set by the front door).
RUN_KEY = pytest.StashKey[Any]()
#: item.stash slot of the keys this test has gated summaries under.
USED_KEYS = pytest.StashKey[set]()


class TraceML:
    """What a test sees as ``traceml``.

    ``tracer``: the live tracer of a ``@pytest.mark.traceml`` test (None elsewhere).
    ``summary``: the last summary this test produced (``finish()`` or ``run_script``).
    """

    def __init__(self, item: pytest.Item, state: TracemlState) -> None:
        self._item = item
        self._state = state
        self.summary: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        """The test's baseline key: the marker's ``key=``, else its node id."""
        run = self._item.stash.get(RUN_KEY, None)
        return run.key if run is not None else self._item.nodeid

    @property
    def tracer(self) -> Any:
        run = self._item.stash.get(RUN_KEY, None)
        return run.tracer if run is not None else None

    def finish(self) -> dict[str, Any]:
        """Finish the test's tracer now and return its summary document, for extra asserts.
        The plugin gates this same summary when the test returns."""
        __tracebackhide__ = True
        run = self._item.stash.get(RUN_KEY, None)
        if run is None:
            pytest.fail("traceml.finish() needs a test marked @pytest.mark.traceml",
                        pytrace=False)
        self.summary = run.finish_now()
        return self.summary

    def run_script(
        self,
        script: str | os.PathLike[str],
        *args: Any,
        key: str | None = None,
        warmup_steps: int | None = None,
        timeout_s: float | None = 600.0,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        nproc_per_node: int | None = None,
    ) -> dict[str, Any]:
        """Run ``script args`` under ``traceml-ci run`` in a subprocess (``--traceml-repeats``
        times, and up to ``--traceml-confirm`` more to confirm a regression), gate the runs
        combined under ``key`` (default: the test's node id) and return that summary. A
        relative ``script`` is looked up next to the test file, then in the working directory.
        ``timeout_s``: per run, in seconds. ``nproc_per_node``: a distributed job of that many
        ranks on this host, launched through torchrun (the script calls
        ``init_process_group``); its merged summary, with the straggler analysis, is gated."""
        __tracebackhide__ = True
        from pytest_plugin.scripts import ScriptFailed, traced_script

        if nproc_per_node is not None and (isinstance(nproc_per_node, bool)
                                           or not isinstance(nproc_per_node, int)
                                           or nproc_per_node < 1):
            pytest.fail(f"traceml.run_script(): nproc_per_node must be a whole number ≥ 1, not "
                        f"{nproc_per_node!r}", pytrace=False)
        state, item = self._state, self._item
        path = self._resolve(Path(script))
        if key is None:
            if item.stash.get(RUN_KEY, None) is not None:
                pytest.fail("traceml.run_script() in a @pytest.mark.traceml test needs its own "
                            "key= (the test's key gates the test's own tracer)", pytrace=False)
            key = item.nodeid
        used = item.stash.setdefault(USED_KEYS, set())
        if key in used:
            pytest.fail(f"traceml: this test already gated a summary under {key!r}; "
                        "pass run_script(..., key=...)", pytrace=False)
        clash = state.key_clash(key, item.nodeid)
        if clash:
            pytest.fail(clash, pytrace=False)
        used.add(key)
        out = state.out_dir(item.nodeid)
        docs: list[dict[str, Any]] = []

        def run_once() -> dict[str, Any]:
            __tracebackhide__ = True
            failure = None
            try:
                docs.append(traced_script(
                    path, [str(a) for a in args], out_dir=out / f"run-{len(docs)}",
                    run_name=key, warmup_steps=warmup_steps, timeout_s=timeout_s, env=env,
                    cwd=Path(cwd) if cwd is not None else None, nproc_per_node=nproc_per_node,
                    module_sample_s=state.options.module_sample_s,
                    root_dir=item.config.rootpath,
                ))
            except ScriptFailed as exc:
                failure = str(exc)
            if failure is not None:  # outside the except block: no chained traceback
                pytest.fail(failure, pytrace=False)
            return docs[-1]

        def profiled(out_dir: Path, steps: int) -> None:
            from traceml_ci.summary.profile import ENV_PROFILE_STEPS

            # Raises ScriptFailed: the escalation turns it into a warning, not a failure.
            traced_script(
                path, [str(a) for a in args], out_dir=out_dir, run_name=key,
                warmup_steps=warmup_steps, timeout_s=timeout_s,
                env={**(env or {}), ENV_PROFILE_STEPS: str(steps)},
                cwd=Path(cwd) if cwd is not None else None, nproc_per_node=nproc_per_node,
                module_sample_s=state.options.module_sample_s, root_dir=item.config.rootpath,
            )

        for _ in range(state.options.runs_per_test):
            run_once()
        # A regression is confirmed by running the script again (--traceml-confirm).
        result = gate_summaries(state, nodeid=item.nodeid, key=key, docs=docs, rerun=run_once,
                                profile=profiled)
        self.summary = result.summary
        return result.summary or docs[-1]

    def _resolve(self, script: Path) -> Path:
        __tracebackhide__ = True
        if script.is_absolute():
            candidates = [script]
        else:
            here = Path(self._item.path).parent
            candidates = [here / script] + ([Path.cwd() / script] if Path.cwd() != here else [])
        for c in candidates:
            if c.is_file():
                return c
        pytest.fail(f"traceml.run_script(): no such script {script} (looked in "
                    + ", ".join(str(c.parent) for c in candidates) + ")", pytrace=False)
        raise AssertionError("unreachable")  # pragma: no cover
