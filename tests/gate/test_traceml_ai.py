"""A traceml-ai summary is read as strictly as our own: a field the mapping reads that holds a
wrong type or an impossible value is one line naming it, exit 2 (``validate`` and ``diff`` alike);
a field that cannot be mapped is said in the report, never dropped without a word."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gate.summaries import TRACEML_AI
from traceml_ci.cli.main import main

FIXTURE = json.loads((TRACEML_AI / "input_bound.json").read_text())


def _set(*path: str | int, to: Any) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        node = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = to

    return change


def _drop(*path: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        node = doc
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]

    return change


AVG = ("step_time", "global", "average")
MED = ("step_time", "global", "median")
WINDOW = ("step_time", "global", "window")

#: A bad value where the mapping reads one -> the JSON path its one line must name.
BAD_VALUES: dict[str, tuple[Callable[[dict], None], str]] = {
    "a word for the average step": (_set(*AVG, "step_time_ms", to="lots"),
                                    "$.step_time.global.average.step_time_ms"),
    "1e300 ms for the average step": (_set(*AVG, "step_time_ms", to=1e300),
                                      "$.step_time.global.average.step_time_ms"),
    "1e300 ms for the median step": (_set(*MED, "step_time_ms", "value", to=1e300),
                                     "$.step_time.global.median.step_time_ms.value"),
    "a string for a phase": (_set(*MED, "forward_ms", "value", to="7"),
                             "$.step_time.global.median.forward_ms.value"),
    "a negative phase": (_set(*MED, "forward_ms", "value", to=-5),
                         "$.step_time.global.median.forward_ms.value"),
    "a bool for a phase": (_set(*AVG, "backward_ms", to=True),
                           "$.step_time.global.average.backward_ms"),
    "an unknown step label": (_set("step_time", "diagnosis", "kind", to="NOT_A_LABEL"),
                              "$.step_time.diagnosis.kind"),
    "markup in the step label": (
        _set("step_time", "diagnosis", "kind", to="<img src=x onerror=alert(1)>"),
        "$.step_time.diagnosis.kind"),
    "an unknown memory label": (_set("step_memory", "diagnosis", "kind", to="NOT_A_LABEL"),
                                "$.step_memory.diagnosis.kind"),
    "a list for step_memory": (_set("step_memory", to=[]), "$.step_memory"),
    "a list for step_time.global": (_set("step_time", "global", to=[]),
                                    "$.step_time.global"),
    "a list for the medians": (_set(*MED, to=[]), "$.step_time.global.median"),
    "a number for a median entry": (_set(*MED, "step_time_ms", to=20.4),
                                    "$.step_time.global.median.step_time_ms"),
    "a list for meta": (_set("meta", to=[]), "$.meta"),
    "a string for the GPU count": (_set("meta", "gpus_observed", to="2"),
                                   "$.meta.gpus_observed"),
    "a negative GPU count": (_set("meta", "gpus_observed", to=-1), "$.meta.gpus_observed"),
    "a number for the run name": (_set("meta", "run_name", to=5), "$.meta.run_name"),
    "an unknown run status": (_set("run_context", "run", "status", to="exploded"),
                              "$.run_context.run.status"),
    "a word for the duration": (_set("duration_s", to="long"), "$.duration_s"),
    "a negative duration": (_set("duration_s", to=-1), "$.duration_s"),
    "a string step count": (_set(*WINDOW, "steps_analyzed", to="200"),
                            "$.step_time.global.window.steps_analyzed"),
    "a fractional step count": (_set(*WINDOW, "steps_analyzed", to=2.5),
                                "$.step_time.global.window.steps_analyzed"),
    "an unknown clock": (_set(*WINDOW, "diagnosis_clock", to="sundial"),
                         "$.step_time.global.window.diagnosis_clock"),
    "a word for the RSS": (_set("process", "global", "worst", "ram_bytes", "value", to="big"),
                           "$.process.global.worst.ram_bytes.value"),
    "a number for generated_at": (_set("generated_at", to=5), "$.generated_at"),
    "a list for run_context": (_set("run_context", to=[]), "$.run_context"),
}


def _write(tmp_path: Path, change: Callable[[dict], None], name: str = "head.json") -> Path:
    doc = copy.deepcopy(FIXTURE)
    change(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _one_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_a_bad_value_is_one_line_naming_the_field_in_validate_and_diff(tmp_path, capsys, case):
    change, where = BAD_VALUES[case]
    head = _write(tmp_path, change)
    assert main(["validate", str(head)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"{head}: traceml-ai summary: {where}: "), line
    assert main(["diff", str(TRACEML_AI / "input_bound.json"), str(head)]) == 2
    line = _one_line(capsys)
    assert str(head) in line and where in line, line


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_drop("schema_version"), "$.schema_version: missing"),
        (_set("schema_version", to="abc"), "$.schema_version: \"abc\" is not a version number"),
        (_set("schema_version", to=True), "$.schema_version: true is not a version number"),
        (_set("schema_version", to=[1, 9]), "$.schema_version: [1, 9] is not a version number"),
        (_set("schema_version", to="1.9"), "$.schema_version: \"1.9\" is a string"),
        (_set("schema_version", to=0.4), "schema_version 0.4 is older than"),
    ],
    ids=["missing", "a word", "a bool", "a list", "a string", "older"],
)
def test_a_missing_or_garbage_schema_version_is_one_line(tmp_path, capsys, change, said):
    """Without a numeric schema_version a traceml-ai summary was judged as one of ours: 27
    lines of our schema's problems. It is known by its sections, and its version is one line."""
    head = _write(tmp_path, change)
    assert main(["validate", str(head)]) == 2
    line = _one_line(capsys)
    assert "traceml-ai" in line and said in line, line


@pytest.mark.parametrize("version", [2.0, 2, "2.0"], ids=["2.0", "2", "the string 2.0"])
def test_schema_2_of_traceml_0_5_1_is_refused_clearly(tmp_path, capsys, version):
    """TraceML 0.5.1 writes schema 2.0 (ns timestamps): not mapped, one line saying so -- the
    string "2.0" was judged as our own summary's version ("reads (1.0)")."""
    doc = copy.deepcopy(FIXTURE)
    doc["schema_version"] = version
    doc["analysis_window"]["start_ts_ns"] = 1795986238352271800
    head = tmp_path / "head.json"
    head.write_text(json.dumps(doc))
    for argv in (["validate", str(head)], ["diff", str(TRACEML_AI / "input_bound.json"),
                                           str(head)]):
        assert main(argv) == 2
        line = _one_line(capsys)
        assert "traceml-ai schema_version 2" in line and "newer than this traceml-ci maps (1.x)" \
            in line, line


def _diff_text(capsys, head: Path) -> str:
    assert main(["diff", str(TRACEML_AI / "input_bound.json"), str(head), "--format",
                 "markdown"]) in (0, 1)
    out, err = capsys.readouterr()
    assert err == "", err
    return out


@pytest.mark.parametrize(
    ("change", "said"),
    [
        # nulls where numbers belong: the phase has no figure, and the report says so
        (lambda d: (_set(*MED, "forward_ms", "value", to=None)(d),
                    _set(*AVG, "forward_ms", to=None)(d)), "step_time.phase_ms.forward"),
        # the median missing, the average used in its place: said
        (_set(*MED, "step_time_ms", "value", to=None), "median missing, average used: "
                                                       "step_time_ms"),
        # their label re-derived by our rule: said (it was kept in mapped_from, not reported)
        (_set("step_time", "diagnosis", "kind", to="COMPUTE_BOUND"),
         "step_time.diagnosis re-derived as INPUT_BOUND (traceml-ai said COMPUTE_BOUND)"),
        # a memory label with no counterpart
        (_set("step_memory", "diagnosis", "kind", to="IMBALANCE"),
         "step_memory.diagnosis (IMBALANCE"),
        # no GPU count: cpu assumed, and said
        (_set("meta", "gpus_observed", to=None), "meta.gpus_observed"),
        (_drop("generated_at"), "run.started_at"),
        (_set("run_context", "run", "status", to="running"), "run_context.run.status running"),
    ],
    ids=["null phase", "null median", "their label", "memory label", "null GPU count",
         "no start time", "still running"],
)
def test_what_cannot_be_mapped_is_said_in_the_report(tmp_path, capsys, change, said):
    head = _write(tmp_path, change)
    assert main(["validate", str(head)]) == 0
    capsys.readouterr()
    assert said in _diff_text(capsys, head)


def test_every_label_and_status_the_schema_accepts_has_a_mapping() -> None:
    """The schema says which memory labels and run statuses a 1.x summary may hold; the mapping
    must say what each becomes (None: no counterpart, reported as not mapped)."""
    from traceml_ci.gate.inputs.traceml_ai import MEMORY_KINDS, RUN_STATUSES, SCHEMA
    from traceml_ci.summary.schema import load_schema

    props = load_schema(SCHEMA)["properties"]
    memory = props["step_memory"]["properties"]["diagnosis"]["properties"]["kind"]["enum"]
    status = props["run_context"]["properties"]["run"]["properties"]["status"]["enum"]
    assert set(memory) == set(MEMORY_KINDS)
    assert set(status) - {None} == set(RUN_STATUSES)


@pytest.mark.parametrize("name", ["input_bound", "compute_bound"])
def test_the_real_summaries_of_traceml_0_5_pass_the_check(name) -> None:
    from traceml_ci.gate.inputs.traceml_ai import problems

    assert problems(json.loads((TRACEML_AI / f"{name}.json").read_text())) == []


def test_a_phase_with_no_figure_is_not_judged_nor_shown_as_zero(tmp_path, capsys) -> None:
    """A null forward_ms (median and average) once showed as 0.00 ms, its share as 0 % and its
    time moved into other: rows judged on figures the file never had."""
    head = _write(tmp_path, lambda d: (_set(*MED, "forward_ms", "value", to=None)(d),
                                       _set(*AVG, "forward_ms", to=None)(d)))
    assert main(["diff", str(TRACEML_AI / "input_bound.json"), str(head), "--format",
                 "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    for name in ("step_time.phase_ms.forward", "step_time.forward_pct", "step_time.other_pct",
                 "step_time.phase_ms.other", "step_time.diagnosis"):
        assert rows[name]["head"] is None and rows[name]["status"] == "ok", rows[name]
        assert rows[name]["note"].startswith("not judged: no figure on one side"), rows[name]
    # the phases that had figures are judged as ever
    assert rows["step_time.backward_pct"]["head"] == rows["step_time.backward_pct"]["base"]
    assert rows["step_time.backward_pct"]["tolerance"] is not None
