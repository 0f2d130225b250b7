"""The live snapshot writer (tracer/live.py): what a snapshot's window holds (on a fake clock,
exactly), snapshots while real loops run (the writer thread, its rate and heartbeat on the
real clock: the point there), the last snapshot of each ending, and never a failure that
reaches the training loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import traceml_ci as traceml
from tests.conftest import sigint_default
from tests.tracer.conftest import finish_and_load
from tests.tracer.fakes import FakeClock, FakeCudaMemory, FakeDevice, FakeEventLog
from tests.tracer.loops import (
    BusyDataset,
    BusyModel,
    BusySGD,
    busy_loader,
    fake_device_run,
    spend_on,
    stopwatch_loop,
    train,
)
from traceml_ci.summary.live import (
    WINDOW_STEPS,
    live_dir,
    read_snapshot,
    snapshot_path,
)
from traceml_ci.tracer import api, live, session
from traceml_ci.tracer.config import ENV_LIVE, TracerConfig
from traceml_ci.tracer.steps import StepStore


@pytest.fixture
def fast_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots every 0.1 s: tests see several in a short loop."""
    monkeypatch.setattr(live, "SNAPSHOT_INTERVAL_S", 0.1)


def wait_for(predicate: Any, timeout_s: float = 30.0) -> Any:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


#: Each step's fetch and forward ms (1-based step number): input-heavy and compute-heavy
#: stretches of 100 steps, of the same step time (no step is an outlier), then 0.5 ms of
#: backward and 0.25 of optimizer.
def _fetch_forward(step: int) -> tuple[float, float]:
    return (3.0, 1.0) if (step - 1) // 100 % 2 == 0 else (0.5, 3.5)


STEP_MS = 4.0 + 0.5 + 0.25


def _window_pct(first: int, last: int) -> dict[str, float]:
    """The shares of steps ``first..last`` (1-based, inclusive), exactly."""
    steps = range(first, last + 1)
    total = STEP_MS * len(steps)
    return {
        "dataloader": 100.0 * sum(_fetch_forward(i)[0] for i in steps) / total,
        "forward": 100.0 * sum(_fetch_forward(i)[1] for i in steps) / total,
        "backward": 100.0 * 0.5 / STEP_MS,
        "optimizer": 100.0 * 0.25 / STEP_MS,
        "other": 0.0,
    }


def test_each_snapshot_is_its_window_of_the_newest_steps(fresh_tracer) -> None:
    """The snapshot's rules, on a fake clock (exact): its window is the newest 100 analysed
    steps, its label is that window's, the first full window after warmup is fixed once
    known. Taken between steps by the test itself (no writer thread: which step a thread's
    tick lands after is up to the scheduler)."""
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=2, run_name="live-run", live=False, clock=clock)
    writer = tracer.live_writer()
    model = BusyModel(1.0, 0.5, spend=spend)
    optimizer = BusySGD(model.parameters(), 0.25, spend=spend)
    fetches = iter([_fetch_forward(i)[0] for i in range(1, 331)])

    def collate(items: list) -> Any:
        spend(next(fetches))
        return torch.randn(4, 8), torch.randn(4, 1)

    loader = DataLoader(BusyDataset(330 * 4), batch_size=4, collate_fn=collate)
    taken_at = (40, 102, 150, 200, 260, 330)
    snaps = []
    for step, (x, y) in enumerate(loader, 1):
        model.forward_ms = _fetch_forward(step)[1]
        with traceml.trace_step(model):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
        if step in taken_at:
            snaps.append(writer.snapshot())
    assert [s["steps_done"] for s in snaps] == list(taken_at)
    first = _window_pct(3, 2 + WINDOW_STEPS)  # steps 3..102: the first after warmup
    for snap in snaps:
        n = snap["steps_done"]
        lo = max(3, n - WINDOW_STEPS + 1)
        truth = _window_pct(lo, n)
        assert snap["window"]["steps"] == n - lo + 1 and snap["window"]["clock"] == "host"
        assert snap["window"]["pct"] == {p: pytest.approx(v, abs=0.01) for p, v in truth.items()}
        kind = snap["diagnosis"]["kind"]
        if truth["dataloader"] >= 36.0:
            assert kind == "INPUT_BOUND", (n, kind, truth)
        elif truth["forward"] + truth["backward"] >= 66.0:
            assert kind == "COMPUTE_BOUND", (n, kind, truth)
        want_first = None if n < 2 + WINDOW_STEPS else first
        assert snap["first_window_pct"] == (
            None if want_first is None
            else {p: pytest.approx(v, abs=0.01) for p, v in want_first.items()})
        assert snap["status"] == "running" and snap["run_name"] == "live-run"
    kinds = {s["diagnosis"]["kind"] for s in snaps}
    assert {"INPUT_BOUND", "COMPUTE_BOUND"} <= kinds  # the windows did differ
    assert snaps[-1]["history_ms"] == [STEP_MS] * len(snaps)  # one point per snapshot
    finish_and_load(tracer)


def test_snapshots_while_a_loop_runs(fresh_tracer, fast_snapshots) -> None:
    """The writer thread, on the real clock: snapshots show up while the loop runs, their
    rate is the loop's (a stopwatch's, loosely: the polling is in its wall time), their thread
    split adds up to a step's wall time, and the last one says how the run ended. What a
    window holds is checked exactly above."""
    tracer = fresh_tracer(warmup_steps=2, run_name="live-run")
    path = snapshot_path(tracer.config.out_dir, 0)
    model = BusyModel(0.5, 0.25)
    optimizer = BusySGD(model.parameters(), 0.25)
    steps = 250
    batches = iter(busy_loader(steps, 1.0))
    seen: list[dict] = []

    def poll() -> None:  # between steps, outside what is timed
        snap = read_snapshot(path)
        if snap is not None and (not seen or snap["heartbeat"] != seen[-1]["heartbeat"]):
            seen.append(snap)

    _, walls = stopwatch_loop(model, optimizer, batches, steps, after_step=poll)
    doc = finish_and_load(tracer)

    assert len(seen) >= 3, "no snapshots while the loop ran"
    assert all(s["status"] == "running" and s["summary_path"] is None for s in seen)
    assert all(s["pid"] == os.getpid() and s["run_name"] == "live-run" for s in seen)
    done = [s["steps_done"] for s in seen]
    assert done == sorted(done) and done[-1] > done[0]
    full = [s for s in seen if s["window"]["steps"] == WINDOW_STEPS]
    assert full, "no snapshot with a full window"
    # The rate is measured from the first snapshot that saw a step (the loop's first steps,
    # slow with the tracer's set-up, included): the stopwatch's over the same steps.
    s0 = next(s["steps_done"] for s in seen if s["steps_done"] > 0)
    for snap in full:
        n = snap["steps_done"]
        assert snap["window"]["clock"] == "host"
        # steps/s over wall time: the stopwatch's rate within the loop (loosely: the test's
        # own polling between steps is in the wall time, not in the steps).
        rate = 1000.0 * (n - s0) / sum(walls[s0:n])
        assert 0.4 * rate < snap["steps_per_s"] < 1.5 * rate, (snap["steps_per_s"], rate)
    if os.path.exists("/proc/self/schedstat"):
        # What the thread waited for a CPU about its window's steps (the live view's straggler
        # rule takes it off a rank's extra own work): the split adds up to a step's wall time.
        for snap in full:
            st = snap["window_summary"]["step_time"]
            split = sum(st["thread"].values())
            assert 0.5 * st["step_ms"]["median"] < split < 2.0 * st["step_ms"]["p90"], st
    assert 1 <= len(seen[-1]["history_ms"]) <= 60
    assert seen[-1]["memory"]["rss_mb"] > 10 and seen[-1]["memory"]["allocated_mb"] is None

    last = read_snapshot(path)
    assert last["status"] == "completed" and last["summary_path"] == str(tracer.path)
    assert last["steps_done"] == doc["step_time"]["steps_total"] == steps
    assert last["window"]["steps"] == WINDOW_STEPS
    assert not tracer.live.running


@pytest.fixture
def fake_cuda(monkeypatch):
    """The model "lives" on cuda:0: fake events that complete ~3 steps late, fake allocator."""
    log = FakeEventLog(lag_records=25)
    memory = FakeCudaMemory(allocated_mb=1000.0, reserved_mb=3000.0, growth_mb=1.0)
    monkeypatch.setattr(session, "device_event_factory", lambda device: log.factory)
    monkeypatch.setattr(session, "CudaMemory", lambda torch_mod, index: memory)
    monkeypatch.setattr(session, "_model_device", lambda models: FakeDevice("cuda", 0))
    monkeypatch.setattr(session.Tracer, "_start_gpu_sampler", lambda self, t, i: None)
    return log, memory


def test_device_clock_snapshots_read_only_resolved_steps(fresh_tracer, fake_cuda) -> None:
    log, _ = fake_cuda
    tracer = fake_device_run(fresh_tracer, log, 40, 0.5, 1.0, 0.5, 0.25)
    store = tracer.store
    assert store.steps_total == 40 and 0 < store.resolved < 40  # some still pending
    snap = tracer.live.snapshot()
    assert snap["steps_done"] == 40
    assert snap["window"]["steps"] == store.resolved - 2  # resolved rows only, past warmup
    assert snap["window"]["clock"] == "device_event"
    # The window's own phases, exactly (the device events carry the fake clock's time).
    assert snap["window"]["phase_ms"] == {"dataloader": 0.5, "forward": 1.0, "backward": 0.5,
                                          "optimizer": 0.25, "other": 0.0}
    # The newest resolved step's device peaks (the fake allocator grows 1 MB a step).
    assert snap["memory"]["allocated_mb"] == 1000.0 + store.resolved
    assert snap["memory"]["reserved_mb"] == 3000.0 + store.resolved
    assert snap["memory"]["growth_basis"] == "allocated"
    assert snap["memory"]["growth_mb_per_1k_steps"] == pytest.approx(1000.0, rel=0.01)
    finish_and_load(tracer)
    last = read_snapshot(snapshot_path(tracer.config.out_dir, 0))
    assert last["status"] == "completed" and last["window"]["steps"] == 38


SCRIPT = textwrap.dedent(
    """
    import sys, time
    import torch
    import traceml_ci as traceml

    torch.set_num_threads(1)
    out, ending = sys.argv[1], sys.argv[2]
    traceml.init(out_dir=out, run_name="ending", warmup_steps=2)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    step = 0
    while True:
        for x, y in loader:
            with traceml.trace_step(model):
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                end = time.perf_counter() + 0.002
                while time.perf_counter() < end:
                    pass
                opt.step()
            step += 1
            if ending == "crashed" and step == 300:
                raise RuntimeError("boom")
            if ending == "completed" and step == 300:
                sys.exit(0)
    """
)


@pytest.mark.parametrize("ending", ["completed", "crashed", "sigint", "sigterm"])
def test_last_snapshot_says_how_the_run_ended(tmp_path: Path, ending: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    path = snapshot_path(out, 0)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", ENV_LIVE)}
    proc = subprocess.Popen([sys.executable, str(script), str(out), ending], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)
    try:
        # A running snapshot shows up while the loop goes (for the signals: then we send one).
        # 90 s: a hang guard only -- beside two busy loops and other suites (load ~14 on 2
        # cores) a child took over 30 s to import torch and reach its 20th step.
        running = wait_for(lambda: (s := read_snapshot(path)) and s["steps_done"] >= 20 and s,
                           timeout_s=90.0)
        assert running["status"] == "running" and running["pid"] == proc.pid
        if ending in ("sigint", "sigterm"):
            proc.send_signal(signal.SIGINT if ending == "sigint" else signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    status = {"sigint": "interrupted", "sigterm": "interrupted"}.get(ending, ending)
    last = read_snapshot(path)
    assert last is not None, err
    assert last["status"] == status, err
    summary = out / "final_summary.json"
    assert last["summary_path"] == str(summary) and summary.is_file()
    assert last["steps_done"] >= 20 and last["pid"] == proc.pid
    if ending in ("completed", "crashed"):
        assert last["steps_done"] == 300


def collate_in_worker(items: list) -> Any:
    """A worker's batch, plus what the worker saw: init()'s answer and its threads."""
    x = torch.stack([a for a, _ in items])
    y = torch.stack([b for _, b in items])
    threads = sorted(t.name for t in threading.enumerate())
    return x, y, traceml.init() is None, threads


def test_dataloader_workers_write_no_snapshot(fresh_tracer, fast_snapshots) -> None:
    tracer = fresh_tracer(warmup_steps=2)
    folder = live_dir(tracer.config.out_dir)
    model = BusyModel(0.5, 0.5)
    optimizer = BusySGD(model.parameters(), 0.25)
    loader = DataLoader(BusyDataset(200), batch_size=4, num_workers=2,
                        collate_fn=collate_in_worker)
    files, pids, worker_threads, worker_init_none = set(), set(), set(), set()
    for x, y, init_none, threads in loader:
        with traceml.trace_step(model):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
        worker_init_none.add(init_none)
        worker_threads.update(threads)
        if folder.is_dir():
            files.update(p.name for p in folder.iterdir() if not p.name.startswith("."))
            snap = read_snapshot(folder / "rank0.json")
            if snap is not None:
                pids.add(snap["pid"])
        time.sleep(0.005)
    finish_and_load(tracer)
    files.update(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert worker_init_none == {True}  # init() in a worker does nothing
    assert "traceml-ci-live" not in worker_threads
    assert files == {"rank0.json"} and pids == {os.getpid()}
    assert read_snapshot(folder / "rank0.json")["status"] == "completed"


def test_a_failing_snapshot_warns_once_and_training_goes_on(
    fresh_tracer, fast_snapshots, monkeypatch, capfd
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("snapshot boom")

    monkeypatch.setattr(live, "build_summary", broken)
    tracer = fresh_tracer(warmup_steps=2)
    wait_for(lambda: not tracer.live.running, 10)
    model = BusyModel(0.2, 0.2)
    optimizer = BusySGD(model.parameters(), 0.1)
    assert train(busy_loader(60, 0.2), model, optimizer, traceml.trace_step, 60) == 60
    doc = finish_and_load(tracer)  # the final summary does not depend on the writer
    assert doc["step_time"]["steps_total"] == 60
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("traceml-ci: warning:")]
    assert len(warnings) == 1 and "snapshot boom" in warnings[0], err
    assert "training goes on" in warnings[0]
    assert not snapshot_path(tracer.config.out_dir, 0).exists()


def test_live_false_writes_nothing(fresh_tracer, fast_snapshots) -> None:
    tracer = fresh_tracer(warmup_steps=2, live=False)
    model = BusyModel(0.2, 0.2)
    optimizer = BusySGD(model.parameters(), 0.1)
    train(busy_loader(60, 1.0), model, optimizer, traceml.trace_step, 60)
    finish_and_load(tracer)
    assert tracer.live is None
    assert not live_dir(tracer.config.out_dir).exists()
    assert "traceml-ci-live" not in {t.name for t in threading.enumerate()}


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), ("", True)])
def test_env_turns_the_writer_off(monkeypatch, value: str, on: bool) -> None:
    monkeypatch.setenv(ENV_LIVE, value)
    assert TracerConfig().live is on


def test_init_live_false_after_start_stops_and_removes_the_snapshot(
    tmp_path: Path, torch_single_thread, fast_snapshots
) -> None:
    """A launcher started the tracer (live on); the script's init(live=False) wins."""
    tracer = api.start(TracerConfig(out_dir=tmp_path / "out"), at_exit=False)
    try:
        path = snapshot_path(tmp_path / "out", 0)
        wait_for(path.exists, 10)
        assert api.init(live=False) is tracer
        assert tracer.live is None and not path.exists()
        model = BusyModel(0.2, 0.2)
        optimizer = BusySGD(model.parameters(), 0.1)
        train(busy_loader(20, 0.5), model, optimizer, traceml.trace_step, 20)
        finish_and_load(tracer)
        assert not path.exists()
    finally:
        api.stop()


class HalvingColumn:
    """A column whose slicing halves the store's columns first: a halving that lands in the
    middle of a read, made deterministic."""

    def __init__(self, real: Any, columns: Any) -> None:
        self.real, self.columns, self.fired = real, columns, False

    def __getitem__(self, key: Any) -> Any:
        if not self.fired:
            self.fired = True
            self.columns.cols[3] = self.real  # put the real column back, then halve
            self.columns._halve()
        return self.real[key]


def test_a_halving_during_a_read_is_read_again() -> None:
    from traceml_ci.tracer.clocks import HostClock
    from traceml_ci.tracer.recorder import ACC_ZERO, PRE

    store = StepStore(HostClock(), 0, None, capacity=16)
    for i in range(16):  # every column of row i holds i (ns; read back as ms)
        acc = [i] * PRE + [0] * (len(ACC_ZERO) - PRE)  # each phase i, nothing fetched before
        store.host_step(0, i, acc, [], [])
    cols = store.columns
    assert cols.n == 16 and cols.stride == 1
    cols.cols[3] = HalvingColumn(cols.cols[3], cols)
    got, stride = live._rows(store, 4)
    assert stride == 2 and cols.n == 8
    rows = list(zip(*got[:5], strict=True))
    # After the halving, the newest rows are steps 8, 10, 12, 14: consistent across columns.
    assert [r[0] for r in rows] == [8e-6, 10e-6, 12e-6, 14e-6]
    assert all(len(set(r)) == 1 for r in rows), rows


def test_a_finished_step_is_visible_within_a_second(fresh_tracer) -> None:
    """At the default interval: the time from a step's end to the first snapshot that counts
    it, as a reader polling the file sees it."""
    tracer = fresh_tracer(warmup_steps=2)
    path = snapshot_path(tracer.config.out_dir, 0)
    model = BusyModel(1.0, 1.0)
    optimizer = BusySGD(model.parameters(), 0.5)
    ended: list[float] = []  # wall time at each step's end
    lags: list[float] = []
    counted = 0
    for x, y in busy_loader(600, 1.0):
        with traceml.trace_step(model):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
        ended.append(time.time())
        snap = read_snapshot(path)
        if snap is not None and snap["steps_done"] > counted:
            now = time.time()
            lags += [now - t for t in ended[counted:snap["steps_done"]]]
            counted = snap["steps_done"]
        if ended[-1] - ended[0] > 1.5:  # a few snapshots at the 0.5 s interval
            break
    finish_and_load(tracer)
    assert counted > 0 and len(lags) == counted
    assert max(lags) < 1.0, max(lags)


def test_a_later_init_out_dir_moves_the_snapshot(tmp_path: Path, torch_single_thread,
                                                 fast_snapshots) -> None:
    tracer = api.start(TracerConfig(out_dir=tmp_path / "a"), at_exit=False)
    try:
        old = snapshot_path(tmp_path / "a", 0)
        wait_for(old.exists, 10)
        api.init(out_dir=tmp_path / "b")
        new = snapshot_path(tmp_path / "b", 0)
        wait_for(new.exists, 10)
        assert not old.exists()
        # The folders the first snapshot made are gone too: a run that moved away from
        # $TRACEML_CI_OUT (say) leaves nothing there.
        assert not (tmp_path / "a").exists()
        model = BusyModel(0.2, 0.2)
        train(busy_loader(10, 0.2), model, BusySGD(model.parameters(), 0.1),
              traceml.trace_step, 10)
        finish_and_load(tracer)
        assert read_snapshot(new)["status"] == "completed" and not old.exists()
    finally:
        api.stop()


def test_a_moved_snapshot_leaves_a_folder_that_was_there_before(
        tmp_path: Path, torch_single_thread, fast_snapshots) -> None:
    (tmp_path / "a").mkdir()
    tracer = api.start(TracerConfig(out_dir=tmp_path / "a"), at_exit=False)
    try:
        wait_for(snapshot_path(tmp_path / "a", 0).exists, 10)
        api.init(out_dir=tmp_path / "b")
        wait_for(snapshot_path(tmp_path / "b", 0).exists, 10)
        assert (tmp_path / "a").is_dir() and not live_dir(tmp_path / "a").exists()
        tracer.finish()
    finally:
        api.stop()


def test_past_max_steps_the_rate_is_unknown(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=2, max_steps=10)
    model = BusyModel(0.2, 0.2)
    train(busy_loader(20, 0.2), model, BusySGD(model.parameters(), 0.1), traceml.trace_step, 20)
    snap = tracer.live.snapshot()
    assert snap["steps_done"] == 10 and snap["max_steps"] == 10
    assert snap["steps_per_s"] is None and snap["window"]["steps"] == 8
    finish_and_load(tracer)


ZERO_CHANGE = textwrap.dedent(
    """
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(50):
        opt.zero_grad()
        ((model(torch.randn(4, 8)) - 1) ** 2).mean().backward()
        opt.step()
    """
)


def test_traceml_ci_run_on_an_unmodified_script_leaves_a_last_snapshot(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(ZERO_CHANGE)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", ENV_LIVE)}
    done = subprocess.run(
        [sys.executable, "-m", "traceml_ci", "run", "--out", str(out), "--run-name", "plain",
         str(script)], env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    last = read_snapshot(snapshot_path(out, 0))
    assert last is not None, done.stderr
    assert last["status"] == "completed" and last["run_name"] == "plain"
    assert last["summary_path"] == str(out / "final_summary.json")
    assert last["steps_done"] == 50 and last["pid"] != os.getpid()


@pytest.mark.cuda
def test_a_cuda_run_snapshots_without_a_sync(fresh_tracer, fast_snapshots, capfd) -> None:
    """On a real GPU: device-clock windows and allocator peaks, and neither the loop nor the
    writer thread synchronises (sync debug mode "error" raises on any synchronising call)."""
    tracer = fresh_tracer(warmup_steps=2)
    path = snapshot_path(tracer.config.out_dir, 0)
    device = torch.device("cuda", 0)
    model = torch.nn.Linear(256, 256).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device=device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(300):
            with traceml.trace_step(model):
                optimizer.zero_grad()
                model(x).square().mean().backward()
                optimizer.step()
        snap = wait_for(lambda: (s := read_snapshot(path)) and s["window"]["steps"] > 0 and s)
        time.sleep(0.3)  # a few more snapshots, still under sync debug mode
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert snap["window"]["clock"] == "device_event"
    assert snap["memory"]["allocated_mb"] > 0
    assert snap["memory"]["reserved_mb"] >= snap["memory"]["allocated_mb"]
    finish_and_load(tracer)
    assert read_snapshot(path)["status"] == "completed"
    assert "warning" not in capfd.readouterr().err


def test_a_relative_out_dir_gives_absolute_paths(fresh_tracer, tmp_path: Path, monkeypatch,
                                                 fast_snapshots) -> None:
    monkeypatch.chdir(tmp_path)
    tracer = fresh_tracer(out_dir="rel-out", warmup_steps=2)
    model = BusyModel(0.2, 0.2)
    train(busy_loader(10, 0.2), model, BusySGD(model.parameters(), 0.1), traceml.trace_step, 10)
    finish_and_load(tracer)
    last = read_snapshot(tmp_path / "rel-out" / "live" / "rank0.json")
    assert last["summary_path"] == str(tmp_path / "rel-out" / "final_summary.json")


def test_a_rank_writes_its_own_file_with_its_identity(fresh_tracer, monkeypatch,
                                                      fast_snapshots) -> None:
    import socket

    from traceml_ci.summary.live import read_snapshots

    for name, value in (("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    tracer = fresh_tracer(warmup_steps=2)
    model = BusyModel(0.2, 0.2)
    train(busy_loader(10, 0.2), model, BusySGD(model.parameters(), 0.1), traceml.trace_step, 10)
    finish_and_load(tracer)
    (snap,) = read_snapshots(tracer.config.out_dir)
    assert snapshot_path(tracer.config.out_dir, 1).is_file()
    assert (snap["rank"], snap["local_rank"], snap["world_size"]) == (1, 1, 2)
    assert snap["host"] == socket.gethostname() and snap["pid"] == os.getpid()
    assert snap["summary_path"].endswith("final_summary.rank1.json")
    assert snap["started_at"] == tracer.summary.run.started_at


def test_a_stalled_run_keeps_its_heartbeat_but_not_its_last_step(fresh_tracer,
                                                                  fast_snapshots) -> None:
    tracer = fresh_tracer(warmup_steps=2)
    path = snapshot_path(tracer.config.out_dir, 0)
    model = BusyModel(0.5, 0.5)
    # ~0.4 s of steps: several snapshots see them (a rate needs two)
    train(busy_loader(200, 0.5), model, BusySGD(model.parameters(), 0.2), traceml.trace_step,
          200)
    last_step = time.time()
    first = wait_for(lambda: (s := read_snapshot(path)) and s["heartbeat"] > last_step and s)
    time.sleep(0.6)  # no steps: an evaluation, a hang
    later = read_snapshot(path)
    assert later["heartbeat"] > first["heartbeat"] + 0.3
    assert later["steps_done"] == first["steps_done"] == 200
    assert later["last_step_at"] == first["last_step_at"] <= last_step + 0.5
    assert later["history_ms"] == first["history_ms"]  # a stalled run adds no points
    assert later["steps_per_s"] < first["steps_per_s"]
    finish_and_load(tracer)
