"""Logging a summary to W&B, against the real library in offline mode (everything under
tmp_path), read back from the offline run's own transaction log."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import loaded_by
from tests.gate.summaries import DATA
from tests.integrations.wandb_offline import read_offline_run
from traceml_ci.errors import install_hint

pytestmark = pytest.mark.integration

wandb = pytest.importorskip("wandb")

SUMMARY = DATA / "input_bound_a.json"
REPO = Path(__file__).resolve().parents[2]


def _offline_env(tmp_path: Path) -> dict[str, str]:
    """W&B offline, every folder it writes (runs, cache, staging, config) under tmp_path."""
    return {
        "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"), "WANDB_DATA_DIR": str(tmp_path / "data"),
        "WANDB_ARTIFACT_DIR": str(tmp_path / "artifacts"),
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
    }


@pytest.fixture
def offline(tmp_path, monkeypatch):
    for key, value in _offline_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield tmp_path
    if wandb.run is not None:
        wandb.run.finish(exit_code=1)
    wandb.teardown()  # stops the wandb-core service process this test started


def _finished_run(root: Path, run_id: str):
    """The offline run as its log holds it, once wandb's service has stopped: ``finish()`` can
    return before the service has flushed the run's log to disk (seen under load)."""
    wandb.teardown()
    (found,) = (root / "wandb").glob(f"offline-run-*-{run_id}")
    return read_offline_run(found)


def _staged_file(artifact) -> dict:
    (entry,) = artifact.manifest.contents
    assert entry.path == "final_summary.json"
    return json.loads(Path(entry.local_path).read_text(encoding="utf-8"))


def test_log_summary_to_a_new_offline_run_reads_back(offline):
    from traceml_ci.integrations.wandb import log_summary

    path = offline / "final_summary.json"
    shutil.copy(SUMMARY, path)
    doc = json.loads(path.read_text())
    run_id = log_summary(path, project="ci")
    assert wandb.run is None  # its own run, finished
    logged = _finished_run(offline, run_id)
    assert (logged.run_id, logged.name, logged.project, logged.job_type) == (
        run_id, "input_bound", "ci", "traceml")
    assert logged.exit_code == 0
    (row,) = logged.history
    st = doc["step_time"]
    for phase in ("dataloader", "forward", "backward", "optimizer", "other"):
        assert row[f"traceml/step_time/{phase}_pct"] == st[f"{phase}_pct"]
    assert row["traceml/step_time/step_ms/median"] == st["step_ms"]["median"]
    assert row["traceml/step_memory/peak_rss_mb"] == doc["step_memory"]["peak_rss_mb"]
    assert "traceml/step_time/diagnosis" not in row  # numbers only in the history
    assert not any(k.startswith("traceml/") and not isinstance(v, (int, float))
                   for k, v in row.items())
    assert logged.summary["traceml/step_time/diagnosis"] == "INPUT_BOUND"
    assert logged.summary["traceml/step_memory/diagnosis"] == "BALANCED"
    assert logged.summary["traceml/diagnosis/step_time/next_step"] == doc["diagnoses"][0][
        "next_step"]
    assert logged.summary["traceml/step_time/dataloader_pct"] == 79.7
    assert set(logged.tags) == {"traceml:INPUT_BOUND", "traceml:BALANCED"}
    (artifact,) = logged.artifacts
    assert (artifact.name, artifact.type) == ("traceml-summary", "traceml-summary")
    assert _staged_file(artifact) == doc


def test_log_summary_dict_into_the_active_run_leaves_it_open(offline):
    from traceml_ci.integrations.wandb import log_summary

    doc = json.loads(SUMMARY.read_text())
    run = wandb.init(project="train", name="mine", tags=["nightly"])
    run.log({"loss": 0.5})
    assert log_summary(doc) == run.id
    assert wandb.run is run  # still the user's to finish
    run.finish()
    logged = _finished_run(offline, run.id)
    assert logged.name == "mine"
    assert set(logged.tags) == {"nightly", "traceml:INPUT_BOUND", "traceml:BALANCED"}
    assert [r.get("loss") for r in logged.history] == [0.5, None]
    assert logged.history[1]["traceml/step_time/dataloader_pct"] == 79.7
    assert _staged_file(logged.artifacts[0]) == doc


def test_log_cli_in_a_real_process(tmp_path):
    path = tmp_path / "final_summary.json"
    shutil.copy(SUMMARY, path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(_offline_env(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "traceml_ci", "log", "--wandb", "--project", "cli",
         "--run-name", "nightly", str(path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"logged {path} to W&B run ")
    (found,) = (tmp_path / "wandb").glob(f"offline-run-*-{proc.stdout.split()[-1]}")
    logged = read_offline_run(found)  # the process has ended: its log is complete
    assert (logged.name, logged.project) == ("nightly", "cli")
    assert logged.summary["traceml/step_time/diagnosis"] == "INPUT_BOUND"


def test_without_wandb_it_is_one_line_and_exit_6(tmp_path, monkeypatch, capsys):
    from traceml_ci.cli.main import main

    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main(["log", "--wandb", str(SUMMARY)]) == 6
    assert capsys.readouterr().err == (
        "traceml-ci: error: logging to W&B needs wandb (wandb is missing): "
        f"{install_hint('wandb')}\n")
    assert main(["log", "--wandb", "--experiment", "x", str(SUMMARY)]) == 2


def test_importing_the_integration_does_not_import_wandb():
    assert loaded_by("traceml_ci.integrations.wandb", ("wandb", "torch", "pandas")) == []
