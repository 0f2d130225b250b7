"""The pytest front door: options, the ``traceml`` marker and fixture, and the hooks.

Only pytest and the standard library load with this module; the tracer (and torch), the gate and
jsonschema are imported when a test is actually traced or a baseline is given, so a session
without traced tests pays next to nothing for the plugin.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # pragma: no cover
    from pytest_plugin.fixture import TraceML
    from pytest_plugin.options import Options
    from pytest_plugin.state import TracemlState

OPTIONS: pytest.StashKey[Options] = pytest.StashKey()
STATE: pytest.StashKey[TracemlState] = pytest.StashKey()

MARKER_HELP = (
    "traceml(warmup_steps=5, max_steps=None, key=None, mode='auto'): trace the test's "
    "training loop (traceml_ci.trace_step) and gate its summary on --traceml-baseline"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    from pytest_plugin.options import add_options

    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    from pytest_plugin.options import SetupError, read_options

    config.addinivalue_line("markers", MARKER_HELP)
    try:
        config.stash[OPTIONS] = read_options(config)
    except SetupError as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.stash[OPTIONS].active:
        _state(config)  # read the baseline and rules now: a bad file stops the session here


def _state(config: pytest.Config) -> TracemlState:
    state = config.stash.get(STATE, None)
    if state is None:
        from pytest_plugin.options import SetupError
        from pytest_plugin.state import TracemlState

        state = TracemlState(config.stash[OPTIONS], is_worker=hasattr(config, "workerinput"))
        state.use_tmp_factory(lambda: getattr(config, "_tmp_path_factory", None))
        try:
            state.load()
        except SetupError as exc:
            raise pytest.UsageError(str(exc)) from None
        config.stash[STATE] = state
    return state


def pytest_report_header(config: pytest.Config) -> str | None:
    state = config.stash.get(STATE, None)
    return state.header() if state is not None else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    marker = item.get_closest_marker("traceml")
    if marker is None:
        return (yield)
    from pytest_plugin.fixture import RUN_KEY, USED_KEYS
    from pytest_plugin.runner import MarkedRun

    run = MarkedRun.begin(item, marker, _state(item.config))
    item.stash[RUN_KEY] = run
    item.stash.setdefault(USED_KEYS, set()).add(run.key)
    try:
        for _ in range(run.repeats - 1):  # --traceml-repeats: earlier runs of the same body
            with run.repeat():
                item.runtest()
        with run.repeat():
            result = yield
        run.gate(rerun=item.runtest)  # a regression is confirmed by running the body again
    finally:
        del item.stash[RUN_KEY]
    return result


@pytest.fixture
def traceml(request: pytest.FixtureRequest) -> TraceML:
    """The running test's tracer (``.tracer``), its summary after ``.finish()``, and
    ``.run_script(path, *args)`` to trace and gate a script run in a subprocess."""
    from pytest_plugin.fixture import TraceML

    return TraceML(request.node, _state(request.config))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist, on the controller: a worker finished; take its results."""
    from pytest_plugin.state import WORKER_OUTPUT_KEY

    payload = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
    if payload:
        _state(node.config).merge_payload(payload)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    state = config.stash.get(STATE, None)
    if state is None:
        return
    if state.is_worker:
        from pytest_plugin.state import WORKER_OUTPUT_KEY

        config.workeroutput[WORKER_OUTPUT_KEY] = state.payload()  # type: ignore[attr-defined]
        return
    state.write_files()
    if state.errors and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None or state.is_worker:
        return
    from pytest_plugin.terminal import write_section

    write_section(terminalreporter, list(state.results.values()),
                  state.notes + state.profile_notes(), state.errors, state.verdict_line())
