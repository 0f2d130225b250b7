"""Shared fixtures: fresh tracers, tiny CPU training loops, and summary validation."""

from __future__ import annotations

import ast
import gc
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
#: Real summaries from other tools (TraceML 0.5.0), copied into the repository.
FIXTURES = REPO / "tests" / "data"


def stopwatch_tolerance_pp(doc: dict, quiet_pp: float) -> float:
    """How far a summary's share may sit from a stopwatch's in the same run: ``quiet_pp`` on a
    quiet CPU, widened by the run's own measured contention (``run.contention``). A process
    preempted for tens of ms between the stopwatch's mark and the tracer's puts that time in
    different phases on the two clocks; the more the run waited for a CPU, the more such
    slices. At 50 % runqueue wait the tolerance doubles; a tracer that misattributes time
    does so whatever the load, and still fails."""
    wait = ((doc.get("run") or {}).get("contention") or {}).get("runqueue_wait_pct")
    wait = wait if isinstance(wait, (int, float)) and 0 <= wait < 100 else 0.0
    return quiet_pp * (1.0 + 2.0 * wait / 100.0)


def loaded_by(imports: str, heavy: tuple[str, ...]) -> list[str]:
    """Which of the ``heavy`` modules a fresh interpreter holds after ``import <imports>``
    (names as an import statement lists them), sorted."""
    probe = (f"import sys, {imports}\n"
             f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    return ast.literal_eval(out.stdout.strip())


def kill_all(procs: Iterable[subprocess.Popen]) -> None:
    """Kill and reap each of a test's processes still running: a test that failed midway
    leaves nothing behind."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


def sigint_default() -> None:
    """``preexec_fn`` of a child a test will send SIGINT: a suite run as a background job
    inherits SIGINT ignored, and Python leaves an ignored SIGINT ignored in its children."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def busy(ms: float) -> None:
    """Spin for ``ms`` wall-clock milliseconds: a known cost, robust to preemption."""
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


def spin_cpu(ms: float) -> None:
    """Burn ``ms`` of this thread's CPU time: work, that a busy CPU stretches like the rest of
    the step (the tracer leaves the thread's waits for a CPU out of module times). A wall-clock
    spin (``busy``) keeps its length while load stretches everything else, so a slower layer's
    share would shrink as the load grows: beside two CPU hogs, 3 -> 9 ms moved backward's share
    by 6 pp, within what the contention guard excuses, and at a 90 % runqueue wait by nothing."""
    end = time.thread_time() + ms / 1000.0
    while time.thread_time() < end:
        pass


@pytest.fixture
def torch_single_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")
    if not hasattr(config, "workerinput"):  # once, in the session's first process
        compile_sources()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection left alive (``gc.freeze``): torch, transformers, lightning and
    the test modules, some 200,000 objects that every full collection would walk again. The
    tracer's tests alone run thousands of collections (their loops make and drop tensors);
    frozen, tests/tracer spent 3.2 s collecting instead of 14.7 s. What a test makes is
    collected as before."""
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test module's last test (its fixtures gone): collect what it left, then freeze
    what lives on -- what the frameworks its tests imported keep -- as after collection. The
    workers' full collections took 6.6 s of CPU in a suite run instead of 11.6 s."""
    yield
    if getattr(nextitem, "module", None) is not getattr(item, "module", None):
        gc.collect()
        gc.freeze()


#: The folders of ours that the suite's child interpreters import.
SOURCES = ("traceml_ci", "pytest_plugin", "tests", "benchmarks", "examples")


def compile_sources() -> None:
    """Byte-compile our sources where the environment keeps Python from caching them
    (``PYTHONDONTWRITEBYTECODE``, set on the development VM): the suite starts hundreds of
    interpreters that import the package, and each would compile it again from source, as an
    installed package never does. A source edited after this is compiled again in memory
    (the cache is checked against its modification time): never stale, only slower."""
    if not sys.dont_write_bytecode:
        return
    import compileall

    for name in SOURCES:
        compileall.compile_dir(REPO / name, quiet=2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("cuda") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)
