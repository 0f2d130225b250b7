"""Log a summary to MLflow: flat metrics, diagnoses as tags, the file as an artifact.

``mlflow`` (the ``[mlflow]`` extra: ``errors.install_hint``) is imported only inside
:func:`log_summary`.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traceml_ci.errors import ApiError
from traceml_ci.integrations import _records
from traceml_ci.summary.view import SummaryView

#: Where the summary file goes among the run's artifacts.
ARTIFACT_DIR = "traceml"
#: MLflow's limits per ``log_batch`` call (metrics, tags).
_BATCH_METRICS, _BATCH_TAGS = 1000, 100


def log_summary(path_or_dict: str | os.PathLike[str] | Mapping[str, Any], run: Any = None, *,
                tracking_uri: str | None = None, experiment: str | None = None,
                run_name: str | None = None) -> str:
    """Log one summary to MLflow and return the run's id.

    ``run``: an MLflow run (``mlflow.start_run()``'s, or a ``Run``) or a run id to log into;
    without one, the active run if there is one (and no ``tracking_uri``/``experiment`` is
    given), else a new run named ``run_name`` (default: the summary's run name) in
    ``experiment`` (default: MLflow's default), finished when logged. Metrics are
    ``traceml/step_time/dataloader_pct``-style names at step 0; the diagnoses and run facts are
    tags; the summary is the artifact ``traceml/final_summary.json``.
    Raises InputError for an invalid summary, MissingDependencyError without mlflow, ApiError
    when MLflow refuses (an unreachable server, a bad tracking URI).
    """
    summary = _records.load(path_or_dict)
    mlflow = _records.tracker("mlflow", "MLflow")

    try:
        return _log(summary, path_or_dict, run, tracking_uri, experiment, run_name)
    except mlflow.exceptions.MlflowException as exc:
        raise ApiError(f"MLflow: {exc.message}") from None


def _log(summary: dict[str, Any], source: Any, run: Any, tracking_uri: str | None,
         experiment: str | None, run_name: str | None) -> str:
    import mlflow
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    own_run = False
    if run is None and tracking_uri is None and experiment is None:
        run = mlflow.active_run()
    if run is not None:
        run_id = run if isinstance(run, str) else run.info.run_id
        client = MlflowClient(tracking_uri=tracking_uri)
    else:
        client = MlflowClient(tracking_uri=tracking_uri)
        name = experiment or "Default"
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else client.create_experiment(name)
        created = client.create_run(experiment_id,
                                    run_name=run_name or SummaryView(summary).run_name)
        run_id, own_run = created.info.run_id, True

    try:
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in _records.flat_metrics(summary).items()]
        tags = [RunTag(k, v) for k, v in _records.text_fields(summary).items()]
        for i in range(0, len(metrics), _BATCH_METRICS):
            client.log_batch(run_id, metrics=metrics[i:i + _BATCH_METRICS])
        for i in range(0, len(tags), _BATCH_TAGS):
            client.log_batch(run_id, tags=tags[i:i + _BATCH_TAGS])
        _log_file(client, run_id, source, summary)
    except BaseException:
        if own_run:
            client.set_terminated(run_id, "FAILED")
        raise
    if own_run:
        client.set_terminated(run_id, "FINISHED")
    return str(run_id)


def _log_file(client: Any, run_id: str, source: Any, summary: dict[str, Any]) -> None:
    """The summary as ``traceml/final_summary.json`` (a dict is written to a temp file)."""
    import json

    with tempfile.TemporaryDirectory(prefix="traceml-mlflow-") as tmp:
        path = Path(tmp) / "final_summary.json"
        if isinstance(source, Mapping):
            path.write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n",
                            encoding="utf-8")
        else:  # the file as it is, under the artifact name every run shares
            path.write_bytes(Path(source).read_bytes())
        client.log_artifact(run_id, str(path), ARTIFACT_DIR)
