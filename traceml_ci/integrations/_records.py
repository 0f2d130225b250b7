"""What a summary becomes in an experiment tracker (MLflow, W&B): flat numeric metrics, short
text fields (diagnoses, run facts), and the document itself. Shared by ``mlflow.py`` and
``wandb.py`` so both log the same names. Pure data: no tracker, torch or gate import."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from traceml_ci.errors import InputError
from traceml_ci.summary.view import SummaryView, finite

#: Every name we log starts with this, so our keys never collide with the user's own.
PREFIX = "traceml"
#: The summary's sections whose numbers become metrics (everything numeric in them).
METRIC_SECTIONS = ("step_time", "step_memory", "gpu", "contention")
#: A tracker's text value is bounded (MLflow: 8,000 characters for a tag); ours are far shorter.
MAX_TEXT = 5000


def tracker(module: str, name: str) -> Any:
    """Import the tracker's package; MissingDependencyError saying what to install."""
    import importlib

    from traceml_ci.errors import MissingDependencyError, install_hint

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"logging to {name} needs {module} ({exc.name or exc} is missing): "
            f"{install_hint(module)}") from None


def load(path_or_dict: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """A validated summary from a file or a dict; InputError naming the problem otherwise."""
    from traceml_ci.summary.io import load_summary
    from traceml_ci.summary.schema import summary_problems

    if isinstance(path_or_dict, Mapping):
        doc = dict(path_or_dict)
        problems = summary_problems(doc)
        if problems:
            raise InputError(None, f"invalid summary: {problems[0]}")
        return doc
    return load_summary(path_or_dict)


def flat_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """Every finite number in the metric sections, keyed by its path:
    ``traceml/step_time/dataloader_pct``, ``traceml/step_time/step_ms/median``, … (booleans,
    labels and missing values are left out), plus ``traceml/run/duration_s``."""
    out: dict[str, float] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        else:
            number = finite(node)
            if number is not None:
                out[path] = number

    view = SummaryView(summary)
    for section in METRIC_SECTIONS:
        walk(view.at([section]), f"{PREFIX}/{section}")
    duration = view.number(["run", "duration_s"])
    if duration is not None:
        out[f"{PREFIX}/run/duration_s"] = duration
    return out


def text_fields(summary: Mapping[str, Any]) -> dict[str, str]:
    """The diagnoses and run facts as short strings: ``traceml/step_time/diagnosis``
    (``INPUT_BOUND``), ``traceml/diagnosis/step_time/message``, the run's name, status, device
    and torch version. For MLflow tags and W&B summary fields."""
    view = SummaryView(summary)
    fields: dict[str, str | None] = {
        f"{PREFIX}/run/name": view.run_name,
        f"{PREFIX}/run/status": view.run_status,
        f"{PREFIX}/run/started_at": view.text(["run", "started_at"]),
        f"{PREFIX}/env/device_type": view.text(["env", "device_type"]),
        f"{PREFIX}/env/torch": view.text(["env", "torch"]),
        f"{PREFIX}/schema_version": view.text(["schema_version"]),
    }
    for area in ("step_time", "step_memory"):
        fields[f"{PREFIX}/{area}/diagnosis"] = view.label(area)
    for d in view.diagnoses:
        area = d.get("area")
        if not isinstance(area, str):
            continue
        for key in ("kind", "severity", "message", "next_step"):
            value = d.get(key)
            if isinstance(value, str):
                fields[f"{PREFIX}/diagnosis/{area}/{key}"] = value
    return {k: v[:MAX_TEXT] for k, v in fields.items() if v}


def diagnosis_kinds(summary: Mapping[str, Any]) -> list[str]:
    """The diagnoses' kinds (``INPUT_BOUND``, …), in order, without repeats."""
    kinds = [d.get("kind") for d in SummaryView(summary).diagnoses]
    return list(dict.fromkeys(k for k in kinds if isinstance(k, str)))
