"""Log a summary to Weights & Biases: flat metrics, diagnoses as summary fields and tags, the
file as an artifact.

``wandb`` (the ``[wandb]`` extra: ``errors.install_hint``) is imported only inside
:func:`log_summary`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traceml_ci.errors import ApiError
from traceml_ci.integrations import _records
from traceml_ci.summary.view import SummaryView

#: The artifact every logged summary is a version of, and its type.
ARTIFACT_NAME = ARTIFACT_TYPE = "traceml-summary"
#: Run tags name the diagnoses: ``traceml:INPUT_BOUND``.
TAG_PREFIX = "traceml:"


def log_summary(path_or_dict: str | os.PathLike[str] | Mapping[str, Any], run: Any = None, *,
                project: str | None = None, run_name: str | None = None) -> str:
    """Log one summary to W&B and return the run's id.

    ``run``: a W&B run (``wandb.init()``'s) to log into; without one, the active run
    (``wandb.run``) if any, else a new run (job type ``traceml``) named ``run_name`` (default:
    the summary's run name) in ``project``, finished when logged. Offline mode
    (``WANDB_MODE=offline``) works as for any run. The numbers are logged as one history row
    (``traceml/step_time/dataloader_pct``, …), the diagnoses and run facts set as summary fields,
    each diagnosis kind added as a run tag (``traceml:INPUT_BOUND``), and the file logged as a
    version of the artifact ``traceml-summary``.
    Raises InputError for an invalid summary, MissingDependencyError without wandb, ApiError
    when W&B refuses (e.g. no API key when online).
    """
    summary = _records.load(path_or_dict)
    wandb = _records.tracker("wandb", "W&B")

    own_run = False
    if run is None:
        run = wandb.run
    if run is None:
        try:
            run = wandb.init(project=project, name=run_name or SummaryView(summary).run_name,
                             job_type="traceml", settings=wandb.Settings(console="off"))
        except wandb.errors.Error as exc:
            raise ApiError(f"W&B: {exc}") from None
        own_run = True
    try:
        run.log(_records.flat_metrics(summary))
        for key, value in _records.text_fields(summary).items():
            run.summary[key] = value
        kinds = [TAG_PREFIX + k for k in _records.diagnosis_kinds(summary)]
        run.tags = tuple(dict.fromkeys([*(run.tags or ()), *kinds]))
        _log_file(wandb, run, path_or_dict, summary)
    except BaseException:
        if own_run:
            run.finish(exit_code=1)
        raise
    run_id = str(run.id)
    if own_run:
        run.finish()
    return run_id


def _log_file(wandb: Any, run: Any, source: Any, summary: dict[str, Any]) -> None:
    """The summary as ``final_summary.json`` in a new version of the ``traceml-summary``
    artifact (``add_file`` copies it to W&B's staging area, so the temp folder can go)."""
    artifact = wandb.Artifact(ARTIFACT_NAME, type=ARTIFACT_TYPE)
    with tempfile.TemporaryDirectory(prefix="traceml-wandb-") as tmp:
        path = Path(tmp) / "final_summary.json"
        if isinstance(source, Mapping):
            path.write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n",
                            encoding="utf-8")
        else:
            path.write_bytes(Path(source).read_bytes())
        artifact.add_file(str(path), name="final_summary.json")
        run.log_artifact(artifact)
