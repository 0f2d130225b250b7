"""The contention probe sees a CPU shared with a busy neighbour, and an idle run as quiet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not (os.path.exists("/proc/self/schedstat") and hasattr(os, "sched_setaffinity")),
    reason="needs Linux schedstats and sched_setaffinity",
)

#: A child that pins itself to one CPU, runs the probe around WORK, and prints the reading.
PROBE = textwrap.dedent("""
    import dataclasses, json, os, sys, time
    os.sched_setaffinity(0, {int(sys.argv[1])})
    from traceml_ci.tracer.contention import ContentionProbe
    probe = ContentionProbe()
    end = time.perf_counter() + float(sys.argv[2])
    if sys.argv[3] == "busy":
        while time.perf_counter() < end:
            pass
    else:
        while time.perf_counter() < end:
            time.sleep(0.01)
    print(json.dumps(dataclasses.asdict(probe.read())))
""")
HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def _probe(cpu: int, seconds: float, work: str) -> dict[str, float | None]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(cpu), str(seconds), work],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_two_busy_loops_on_one_cpu_read_as_contended() -> None:
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(cpu)])
    try:
        reading = _probe(cpu, 1.5, "busy")
    finally:
        hog.kill()
        hog.wait(timeout=10)
    # Two runnable loops on one CPU: each waits about half the time (loose: other work too).
    assert reading["runqueue_wait_pct"] is not None
    assert reading["runqueue_wait_pct"] > 20.0, reading
    assert reading["involuntary_switches_per_s"] is not None
    assert reading["involuntary_switches_per_s"] > 5.0, reading
    assert reading["load_per_cpu"] is not None and reading["load_per_cpu"] >= 0.0


def test_an_idle_run_reads_as_quiet() -> None:
    """A sleeping loop hardly runs, so it hardly waits for a CPU: on a quiet machine under 5 %;
    on a loaded one (each wake-up may queue behind the load) far less than a busy loop on the
    same CPU right after it, which is how loaded that CPU is."""
    cpu = min(os.sched_getaffinity(0))
    reading = _probe(cpu, 1.0, "idle")
    idle = reading["runqueue_wait_pct"]
    assert idle is not None
    assert reading["cpu_steal_pct"] is None or 0.0 <= reading["cpu_steal_pct"] <= 100.0
    if idle >= 5.0:
        loaded = _probe(cpu, 1.0, "busy")["runqueue_wait_pct"]
        # Under half the busy loop's; on a saturated CPU (other suites, load ~20 on 2 cores:
        # busy 95 %, idle 56 % -- each wake-up queues) still 25 pp under it. A sleep counted
        # as a wait, the bug, reads ~100 % however quiet the CPU.
        assert loaded is not None and idle < max(0.5 * loaded, loaded - 25.0), (reading, loaded)


def test_a_traced_run_records_its_contention_in_a_valid_summary(pinned_run_with_a_hog) -> None:
    """A traced run's summary (test_cputime's pinned child, shared: a child costs seconds)."""
    from traceml_ci.summary.io import load_summary

    doc = load_summary(pinned_run_with_a_hog / "final_summary.json")  # validated, schema
    contention = doc["run"]["contention"]
    assert set(contention) == {"runqueue_wait_pct", "involuntary_switches_per_s",
                               "load_per_cpu", "cpu_steal_pct"}
    assert 0.0 <= contention["runqueue_wait_pct"] <= 100.0
    assert contention["involuntary_switches_per_s"] >= 0.0
