"""Logging a summary to MLflow, against the real library with a local SQLite tracking store,
read back with MLflow's own client."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from tests.conftest import loaded_by
from tests.gate.summaries import DATA
from traceml_ci.cli.main import main
from traceml_ci.errors import install_hint

pytestmark = pytest.mark.integration

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("sqlalchemy")  # MLflow's SQLite store
from mlflow.tracking import MlflowClient  # noqa: E402

SUMMARY = DATA / "input_bound_a.json"


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A tracking URI in tmp_path; artifacts land under tmp_path too (MLflow's ./mlruns)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _summary(tmp_path):
    path = tmp_path / "final_summary.json"
    shutil.copy(SUMMARY, path)
    return path, json.loads(path.read_text())


def _artifact(client, run_id, tmp_path) -> dict:
    names = [a.path for a in client.list_artifacts(run_id, "traceml")]
    assert names == ["traceml/final_summary.json"]
    local = client.download_artifacts(run_id, "traceml/final_summary.json", str(tmp_path))
    return json.loads(open(local, encoding="utf-8").read())


def test_log_summary_to_a_new_run_reads_back(tmp_path, store):
    from traceml_ci.integrations.mlflow import log_summary

    path, doc = _summary(tmp_path)
    run_id = log_summary(path, tracking_uri=store, experiment="ci")
    client = MlflowClient(tracking_uri=store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == doc["run"]["name"]
    assert client.get_experiment(run.info.experiment_id).name == "ci"
    metrics, tags = run.data.metrics, run.data.tags
    st = doc["step_time"]
    for phase in ("dataloader", "forward", "backward", "optimizer", "other"):
        assert metrics[f"traceml/step_time/{phase}_pct"] == st[f"{phase}_pct"]
    assert metrics["traceml/step_time/step_ms/median"] == st["step_ms"]["median"]
    assert metrics["traceml/step_time/noise/pct/dataloader/iqr"] == 0.38
    assert metrics["traceml/step_memory/peak_rss_mb"] == doc["step_memory"]["peak_rss_mb"]
    assert metrics["traceml/run/duration_s"] == doc["run"]["duration_s"]
    # numbers only: labels and missing values are not metrics
    assert "traceml/step_time/diagnosis" not in metrics
    assert "traceml/step_memory/peak_allocated_mb" not in metrics
    assert all(k.startswith("traceml/") for k in metrics)
    assert tags["traceml/step_time/diagnosis"] == "INPUT_BOUND"
    assert tags["traceml/step_memory/diagnosis"] == "BALANCED"
    assert tags["traceml/diagnosis/step_time/severity"] == "crit"
    assert tags["traceml/diagnosis/step_time/message"] == doc["diagnoses"][0]["message"]
    assert tags["traceml/run/name"] == "input_bound"
    assert _artifact(client, run_id, tmp_path / "dl") == doc


def test_log_summary_dict_into_the_active_run_leaves_it_open(tmp_path, store, monkeypatch):
    from traceml_ci.integrations.mlflow import log_summary

    _, doc = _summary(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    with mlflow.start_run(run_name="training") as active:
        mlflow.log_metric("loss", 0.5)
        assert log_summary(doc) == active.info.run_id
        assert mlflow.active_run() is not None
        assert MlflowClient().get_run(active.info.run_id).info.status == "RUNNING"
    run = MlflowClient().get_run(active.info.run_id)
    assert run.data.metrics["loss"] == 0.5
    assert run.data.metrics["traceml/step_time/dataloader_pct"] == 79.7
    assert run.data.tags["mlflow.runName"] == "training"
    assert _artifact(MlflowClient(), active.info.run_id, tmp_path / "dl") == doc


def test_log_cli_and_bad_input(tmp_path, store, capsys):
    path, _ = _summary(tmp_path)
    assert main(["log", "--mlflow", "--tracking-uri", store, "--experiment", "cli",
                 "--run-name", "nightly", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"logged {path} to MLflow run ")
    client = MlflowClient(tracking_uri=store)
    run = client.get_run(out.split()[-1])
    assert run.info.run_name == "nightly"
    assert run.data.tags["traceml/step_time/diagnosis"] == "INPUT_BOUND"

    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": "1.0"}')
    assert main(["log", "--mlflow", "--tracking-uri", store, "--experiment", "cli",
                 str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"traceml-ci: error: {bad}: invalid summary: ")
    experiment = client.get_experiment_by_name("cli")
    assert len(client.search_runs([experiment.experiment_id])) == 1  # the bad one logged nothing
    assert main(["log", "--mlflow", "--project", "p", str(path)]) == 2
    capsys.readouterr()
    # a store MLflow cannot use is MLflow refusing: exit 5, one line
    assert main(["log", "--mlflow", "--tracking-uri", "nosuchscheme://x", str(path)]) == 5
    err = capsys.readouterr().err
    assert err.startswith("traceml-ci: error: MLflow: ") and err.count("\n") == 1


def test_without_mlflow_it_is_one_line_and_exit_6(tmp_path, monkeypatch, capsys):
    path, _ = _summary(tmp_path)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow raises ImportError
    assert main(["log", "--mlflow", str(path)]) == 6
    err = capsys.readouterr().err
    assert err == ("traceml-ci: error: logging to MLflow needs mlflow (mlflow is missing): "
                   f"{install_hint('mlflow')}\n")


def test_importing_the_integration_does_not_import_mlflow():
    imports = "traceml_ci.integrations.mlflow, traceml_ci.cli.log"
    assert loaded_by(imports, ("mlflow", "torch", "pandas")) == []


def test_the_hf_callback_logs_its_summary_into_the_trainers_run(tmp_path, store):
    """``TraceMLCallback(log_to=("mlflow",))``: at train end the summary goes into the MLflow
    run that is open (here the test's; under the Trainer's MLflow integration, its own)."""
    pytest.importorskip("transformers")
    from transformers import Trainer, default_data_collator

    from tests.integrations.test_hf import (
        BATCH,
        SpinDataset,
        Stopwatch,
        cpu_args,
        item,
        tiny_bert,
    )
    from traceml_ci.integrations.hf import TraceMLCallback

    mlflow.set_tracking_uri(store)
    watch = Stopwatch()
    args = cpu_args(tmp_path, max_steps=6)
    with mlflow.start_run() as run:
        Trainer(model=tiny_bert(watch), args=args,
                train_dataset=SpinDataset(6 * BATCH, 0.0, item, watch),
                data_collator=default_data_collator,
                callbacks=[TraceMLCallback(out_dir=tmp_path / "out", warmup_steps=1,
                                           log_to=("mlflow",))]).train()
    data = MlflowClient(store).get_run(run.info.run_id).data
    written = json.loads((tmp_path / "out" / "final_summary.json").read_text())
    assert data.metrics["traceml/step_time/forward_pct"] == pytest.approx(
        written["step_time"]["forward_pct"])
    with pytest.raises(ValueError, match="log_to"):
        TraceMLCallback(log_to=("tensorboard",))
