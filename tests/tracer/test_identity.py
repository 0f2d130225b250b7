"""A run's identity (tracer/identity.py) and the tracer's one reader of the environment
(tracer/config.py): parsed once, each missing or unreadable launcher value one way."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from traceml_ci.summary.keys import SUMMARY_FILENAME
from traceml_ci.tracer.config import (
    ENV_GATHER_TIMEOUT,
    GATHER_TIMEOUT_S,
    gather_timeout_s,
    live_from_env,
    read_identity,
)
from traceml_ci.tracer.identity import Identity, rank_summary_name


def _parse(**env: str) -> Identity:
    return Identity.parse(env, ["/x/train_gpt.py", "--lr", "1"], "node-a", 42)


def test_a_process_no_launcher_placed_is_rank_0_of_1_under_its_script_name() -> None:
    ident = _parse()
    assert (ident.rank, ident.world_size, ident.local_rank, ident.node_rank) == (0, 1, None, None)
    assert ident.run_name(None) == "train_gpt" and ident.run_name("given") == "given"
    assert ident.summary_name == SUMMARY_FILENAME
    assert ident.snapshot_fields() == {"rank": 0, "local_rank": 0, "world_size": 1,
                                       "host": "node-a", "pid": 42}
    assert ident.placement() == {"local_rank": None, "node_rank": None, "host": "node-a"}


def test_torchrun_values_name_the_rank_and_its_files() -> None:
    ident = _parse(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", GROUP_RANK="1")
    assert (ident.rank, ident.world_size, ident.local_rank, ident.node_rank) == (3, 4, 1, 1)
    assert ident.summary_name == ident.rank_summary_name == "final_summary.rank3.json"
    assert rank_summary_name(0) == "final_summary.rank0.json"  # rank 0's own, beside the merge
    assert ident.snapshot_fields()["local_rank"] == 1
    assert ident.placement() == {"local_rank": 1, "node_rank": 1, "host": "node-a"}


@pytest.mark.parametrize("value", ["", "two", "1.5"])
def test_an_empty_or_unreadable_value_is_unset_never_an_error(value: str) -> None:
    ident = _parse(RANK=value, WORLD_SIZE=value, LOCAL_RANK=value, GROUP_RANK=value)
    assert (ident.rank, ident.world_size, ident.local_rank, ident.node_rank) == (0, 1, None, None)


def test_no_script_name_falls_back_to_run() -> None:
    assert Identity.parse({}, [], "h", 1).run_name(None) == "run"
    assert Identity.parse({}, [""], "h", 1).run_name(None) == "run"


def test_read_identity_reads_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    ident = read_identity()
    assert (ident.rank, ident.world_size, ident.local_rank) == (2, 3, None)
    assert ident.host == socket.gethostname() and ident.pid == os.getpid()
    expected = os.path.splitext(os.path.basename(sys.argv[0]))[0] if sys.argv[0] else "run"
    assert ident.script == (expected or "run")


def test_the_tracer_reads_its_identity_once_at_start(fresh_tracer, monkeypatch) -> None:
    """The environment changing later moves neither the summary nor what it says."""
    import traceml_ci as traceml
    from tests.tracer.conftest import finish_and_load

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    tracer = fresh_tracer(warmup_steps=0, live=False, run_name=None)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    for _ in range(3):
        with traceml.trace_step():
            pass
    doc = finish_and_load(tracer)
    assert tracer.path == tracer.config.out_dir / "final_summary.rank1.json"
    assert (doc["run"]["rank"], doc["run"]["world_size"]) == (1, 2)
    assert doc["run"]["name"] == tracer.identity.script


@pytest.mark.parametrize(
    "value, on",
    [(None, True), ("", True), ("1", True), ("yes", True), ("0", False), ("false", False),
     (" OFF ", False), ("no", False)],
)
def test_live_from_env(value: str | None, on: bool) -> None:
    assert live_from_env(value) is on


@pytest.mark.parametrize("value, seconds", [(None, GATHER_TIMEOUT_S), ("5", 5.0), ("0.1", 1.0),
                                            ("soon", GATHER_TIMEOUT_S)])
def test_gather_timeout_is_read_at_least_one_second(monkeypatch, value, seconds) -> None:
    if value is None:
        monkeypatch.delenv(ENV_GATHER_TIMEOUT, raising=False)
    else:
        monkeypatch.setenv(ENV_GATHER_TIMEOUT, value)
    assert gather_timeout_s() == seconds
