"""Settings rows (gate/settings.py): a setting that changes cost, compared exactly; the worse
way regresses naming the setting and its fix, the way back improves, on any clock."""

from __future__ import annotations

import pytest

from tests.gate.summaries import make
from traceml_ci.gate import Status, Verdict, compare
from traceml_ci.gate.results import Evidence

LOADER = {"num_workers": 2, "pin_memory": False, "persistent_workers": False,
          "prefetch_factor": 2, "batch_size": 16, "device": "cpu"}


def with_loader(clock: str = "host", **changes):
    doc = make(clock=clock)
    doc["step_time"]["dataloader"] = dict(LOADER, **changes)
    return doc


def test_fewer_workers_regress_naming_the_setting_and_the_fix_on_a_host_clock():
    c = compare(with_loader(), with_loader(num_workers=0, prefetch_factor=None))
    row = c.row("settings.dataloader.num_workers")
    assert (row.base, row.head, row.status) == (2, 0, Status.REGRESSED)
    assert row.evidence is Evidence.SETTING
    assert row.cause == "DataLoader num_workers 2 → 0"
    assert "raise num_workers" in row.note
    assert c.verdict is Verdict.REGRESSION
    # without workers on one side the worker settings mean nothing: no row for them
    assert c.row("settings.dataloader.prefetch_factor") is None
    assert c.causes[0] == "DataLoader num_workers 2 → 0"


def test_the_way_back_is_improved():
    c = compare(with_loader(num_workers=0), with_loader())
    assert c.row("settings.dataloader.num_workers").status is Status.IMPROVED
    assert c.verdict is Verdict.PASS


@pytest.mark.parametrize(("key", "head", "status"), [
    ("batch_size", 32, Status.REGRESSED),  # neither better nor worse: a change to accept
    ("persistent_workers", True, Status.IMPROVED),
    ("prefetch_factor", 1, Status.REGRESSED),
    ("pin_memory", True, Status.OK),  # no device to copy to: no cost either way
])
def test_each_loader_setting_has_its_direction(key, head, status):
    row = compare(with_loader(), with_loader(**{key: head})).row(f"settings.dataloader.{key}")
    assert row.status is status
    if status is Status.OK:
        assert "no device" in row.note


def test_pinned_memory_turned_off_on_a_device_regresses():
    base = with_loader(clock="device_event", pin_memory=True, device="cuda:0")
    head = with_loader(clock="device_event", pin_memory=False, device="cuda:0")
    row = compare(base, head).row("settings.dataloader.pin_memory")
    assert row.status is Status.REGRESSED and "pin_memory=True" in row.note


def test_unchanged_settings_are_quiet_and_a_summary_without_them_has_no_row():
    c = compare(with_loader(), with_loader())
    rows = [r for r in c.rows if r.name.startswith("settings.")]
    assert rows and all(r.status is Status.OK and not r.note for r in rows)
    assert c.verdict is Verdict.PASS
    older = make(clock="host")
    older["step_time"].pop("dataloader", None)
    assert not [r for r in compare(older, with_loader()).rows if r.name.startswith("settings.")]
