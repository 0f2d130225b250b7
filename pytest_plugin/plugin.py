"""The pytest front door: options, the ``traceml`` marker and fixture, and the hooks.

Only pytest and the standard library load with this module; the tracer (and torch), the gate and
jsonschema are imported when a test is actually traced or a baseline is given, so a session
without traced tests pays next to nothing for the plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
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
            state.start_ab(config.rootpath)
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
    ab = _ab_applies(item, marker)
    if marker is None and not ab:
        return (yield)
    # The body is replaced for this call: pytest's own call of item.runtest() runs ours.
    body = item.runtest
    if ab:
        item.runtest = lambda: _ab_call(item, marker, body)  # type: ignore[method-assign]
    else:
        item.runtest = lambda: _traced_call(item, marker, body)  # type: ignore[method-assign]
    try:
        return (yield)
    finally:
        del item.runtest  # the class's method again


def _traced_call(item: pytest.Item, marker: Any, body: Callable[[], Any]) -> None:
    """A marked test: each repeat of the body under a fresh tracer, then the gate."""
    __tracebackhide__ = True
    from pytest_plugin.fixture import RUN_KEY, USED_KEYS
    from pytest_plugin.runner import MarkedRun

    run = MarkedRun.begin(item, marker, _state(item.config))
    item.stash[RUN_KEY] = run
    item.stash.setdefault(USED_KEYS, set()).add(run.key)
    try:
        for _ in range(run.repeats):  # --traceml-repeats: runs of the same body
            with run.repeat():
                body()
        run.gate(rerun=body)  # a regression is confirmed by running the body again
    finally:
        del item.stash[RUN_KEY]


def _ab_applies(item: pytest.Item, marker: Any) -> bool:
    """--traceml-ab judges marked tests and tests that use the ``traceml`` fixture (its
    ``run_script``); an A/B child session never does (it is one side of one round)."""
    options = item.config.stash[OPTIONS]
    return options.ab is not None and (
        marker is not None or "traceml" in getattr(item, "fixturenames", ()))


def _ab_call(item: pytest.Item, marker: Any, body: Callable[[], Any]) -> None:
    """One test under --traceml-ab: its rounds in child sessions, then pass or fail on the
    verdict; a test the base lacks runs here as without A/B and passes with a note."""
    __tracebackhide__ = True
    from pytest_plugin.ab import NO_BASE, AbOutcome, NoBase, SideFailed, run_test
    from pytest_plugin.runner import marker_args

    state = _state(item.config)
    assert state.ab is not None
    key = (marker_args(marker).key if marker is not None else None) or item.nodeid
    failure = no_base = None
    if not state.is_worker and not state.ab.batch_tried:  # under xdist a worker cannot know
        # which tests it will be sent
        state.ab.batch_first_round(
            [i.nodeid for i in item.session.items
             if _ab_applies(i, i.get_closest_marker("traceml"))],
            state.out_dir("ab-first-round"))
    try:
        outcome, message, head = run_test(item.nodeid, state.ab, state.out_dir(item.nodeid), key,
                                          report_only=state.options.report_only)
    except NoBase as exc:
        no_base = str(exc)
    except SideFailed as exc:
        failure = str(exc)
    if failure is not None:  # outside the except block: no chained traceback
        pytest.fail(failure, pytrace=False)
    if no_base is not None:
        state.record_ab(AbOutcome(item.nodeid, key, NO_BASE, no_base))
        if marker is not None:
            _traced_call(item, marker, body)
        else:
            body()
        return
    state.record_ab(outcome, head)
    if message:
        pytest.fail(message, pytrace=False)
    if outcome.verdict == "inconclusive" and state.options.ab_inconclusive == "warn":
        item.warn(pytest.PytestWarning(f"traceml: A/B {outcome.detail}"))


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
    options = config.stash.get(OPTIONS, None)
    if options is not None and options.ab_child is not None:
        _answer_parent(session, options.ab_child, state)
        return
    if state is None:
        return
    state.close_ab()  # the base's worktree goes first, whatever else fails below
    if state.is_worker:
        from pytest_plugin.state import WORKER_OUTPUT_KEY

        config.workeroutput[WORKER_OUTPUT_KEY] = state.payload()  # type: ignore[attr-defined]
        return
    state.write_files()
    if state.errors and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


#: An A/B child's node ids that failed (any phase), and those whose body ran, for its answer.
CHILD_FAILED: pytest.StashKey[set[str]] = pytest.StashKey()
CHILD_RAN: pytest.StashKey[set[str]] = pytest.StashKey()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, Any]:
    report = yield
    options = item.config.stash.get(OPTIONS, None)
    if options is not None and options.ab_child is not None:
        if report.failed:
            item.config.stash.setdefault(CHILD_FAILED, set()).add(item.nodeid)
        if report.when == "call":
            item.config.stash.setdefault(CHILD_RAN, set()).add(item.nodeid)
    return report


def _answer_parent(session: pytest.Session, path: Any, state: TracemlState | None) -> None:
    """An A/B child: tell the parent what was collected, how the session ended, the summaries
    its tests traced (in the order they were gated) and, per test, whether it passed and the
    keys it traced (a child may run several tests: a batched first round)."""
    from pytest_plugin.ab import write_child_doc

    results = {} if state is None else state.results
    summaries = {k: r.summary for k, r in results.items() if r.summary is not None}
    failed = session.config.stash.get(CHILD_FAILED, set())
    ran = session.config.stash.get(CHILD_RAN, set())  # not one that -x or maxfail left out
    nodes: dict[str, dict[str, Any]] = {
        item.nodeid: {"passed": item.nodeid not in failed, "keys": []}
        for item in session.items if item.nodeid in ran}
    for key, r in results.items():
        if r.summary is not None and r.nodeid in nodes:
            nodes[r.nodeid]["keys"].append(key)
    write_child_doc(path, session.testscollected, int(session.exitstatus), summaries, nodes)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        state.close_ab()  # a session that ended before sessionfinish (an internal error)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None or state.is_worker:
        return
    from pytest_plugin.terminal import write_section

    write_section(terminalreporter, list(state.results.values()),
                  state.notes + state.profile_notes(), state.errors, state.verdict_line(),
                  ab=state.ab_outcomes.values())
