"""The snapshot format (summary/live.py): readers never fail on what a writer left, ranks
sort, stale heartbeats show, and the fields come from a real summary dict."""

from __future__ import annotations

import json
from pathlib import Path

from traceml_ci.summary import live
from traceml_ci.summary.build import RunRecord, StepSeries, build_summary
from traceml_ci.summary.model import RunInfo, RunStatus


def window_doc(steps: int = 50) -> dict:
    """A summary dict over ``steps`` steps of 10 ms: dataloader 6, forward 2, backward 1,
    optimizer 0.5 (other 0.5)."""
    record = RunRecord(
        run=RunInfo(name="w", status=RunStatus.COMPLETED, started_at="2026-01-01T00:00:00Z",
                    duration_s=1.0, mode="auto"),
        env={}, clock="host", steps_total=steps + 5, warmup_steps=5,
        series=StepSeries(step_ms=[10.0] * steps,
                          phase_ms={"dataloader": [6.0] * steps, "forward": [2.0] * steps,
                                    "backward": [1.0] * steps, "optimizer": [0.5] * steps}),
    )
    return build_summary(record).to_dict()


def snapshot(rank: int = 0, **kw) -> dict:
    args = dict(steps_done=55, steps_per_s=90.0, history_ms=[10.0] * 70,
                first_window_pct={"dataloader": 50.0}, memory={"rss_mb": 100.0},
                identity={"rank": rank, "run_name": "w", "pid": 1}, heartbeat=1000.0)
    args.update(kw)
    return live.snapshot_from_summary(window_doc(), **args)


def test_snapshot_fields_come_from_the_summary() -> None:
    snap = snapshot()
    assert snap["live_version"] == live.LIVE_VERSION and snap["status"] == live.RUNNING
    assert snap["window"]["pct"] == {"dataloader": 60.0, "forward": 20.0, "backward": 10.0,
                                     "optimizer": 5.0, "other": 5.0}
    assert snap["window"]["steps"] == 50 and snap["window"]["step_ms"]["median"] == 10.0
    assert snap["diagnosis"]["kind"] == "INPUT_BOUND"
    assert len(snap["history_ms"]) == live.HISTORY_POINTS  # the newest points only
    assert snap["first_window_pct"]["forward"] is None  # unknown phases stay unknown
    assert snap["max_steps"] is None and snap["last_step_at"] is None
    json.dumps(snap, allow_nan=False)


def test_read_snapshot_never_raises(tmp_path: Path) -> None:
    good = tmp_path / "rank0.json"
    good.write_text(json.dumps(snapshot()))
    assert live.read_snapshot(good)["run_name"] == "w"
    cases = {
        "missing": None,
        "torn": json.dumps(snapshot())[:40],
        "not an object": "[1, 2]",
        "other major version": json.dumps({**snapshot(), "live_version": "2.0"}),
        "no version": json.dumps({"status": "running"}),
        "too big": json.dumps({**snapshot(), "pad": "x" * live.MAX_SNAPSHOT_BYTES}),
        "not utf-8": b"\xff\xfe{".decode("latin-1"),
    }
    for name, text in cases.items():
        path = tmp_path / f"{name}.json"
        if text is not None:
            path.write_bytes(text.encode("latin-1") if name == "not utf-8" else text.encode())
        assert live.read_snapshot(path) is None, name


def test_read_snapshots_orders_ranks_and_skips_the_rest(tmp_path: Path) -> None:
    folder = live.live_dir(tmp_path)
    folder.mkdir()
    for rank in (10, 2, 0):
        live.snapshot_path(tmp_path, rank).write_text(json.dumps(snapshot(rank)))
    (folder / ".rank3.json.123.tmp").write_text(json.dumps(snapshot(3)))  # a write under way
    (folder / "rank4.json").write_text("{")  # torn
    (folder / "notes.json").write_text(json.dumps(snapshot(5)))
    assert [s["rank"] for s in live.read_snapshots(tmp_path)] == [0, 2, 10]
    assert live.read_snapshots(tmp_path / "nowhere") == []


def test_stale_means_running_with_an_old_heartbeat() -> None:
    snap = snapshot(heartbeat=1000.0)
    assert not live.is_stale(snap, now=1000.0 + live.STALE_AFTER_S - 1)
    assert live.is_stale(snap, now=1000.0 + live.STALE_AFTER_S + 1)
    ended = snapshot(heartbeat=1000.0, status="completed")
    assert not live.is_stale(ended, now=1e9)  # an ended run is final, not stale
