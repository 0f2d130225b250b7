"""``traceml-ci diff`` / ``compare``: exit codes, formats, rules, and every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.gate.summaries import DATA, TRACEML_AI, make, real, shift
from traceml_ci.cli.main import main
from traceml_ci.gate import write_baseline_set
from traceml_ci.gate.render.comparison import MARKER
from traceml_ci.summary.model import RunStatus
from traceml_ci.tracer.fallback import write_fallback_summary

A, B = DATA / "input_bound_a.json", DATA / "input_bound_b.json"


def dump(path, doc):
    path.write_text(json.dumps(doc) if not isinstance(doc, (bytes, str)) else doc)
    return str(path)


@pytest.fixture(autouse=True)
def _no_pyproject_rules(tmp_path, monkeypatch):
    """Run from a folder without pyproject.toml, so only the defaults apply."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NO_COLOR", raising=False)


def run(capsys, *argv):
    code = main(["diff", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_same_job_twice_passes_with_exit_0(capsys):
    code, out, err = run(capsys, A, B)
    assert code == 0
    assert out.startswith("traceml-ci pass: ")
    assert err == ""


def test_regression_exits_1_and_the_alias_compare_works(tmp_path, capsys):
    head = dump(tmp_path / "head.json", make(shift(dataloader=4.0)))
    base = dump(tmp_path / "base.json", make())
    code = main(["compare", base, head])
    out, _ = capsys.readouterr()
    assert code == 1
    assert out.startswith("traceml-ci regression: ")


def test_warn_exits_0(tmp_path, capsys):
    base = dump(tmp_path / "base.json", make())
    head = dump(tmp_path / "head.json", make(shift(dataloader=0.9)))
    code, out, _ = run(capsys, base, head)
    assert code == 0 and out.startswith("traceml-ci warn: ")


def test_incomparable_exits_3(tmp_path, capsys):
    base = dump(tmp_path / "b.json", {"schema_version": "1.0", "summaries": {"a": make()}})
    head = dump(tmp_path / "h.json", {"schema_version": "1.0",
                                      "summaries": {"b": make(), "c": make()}})
    code, out, _ = run(capsys, base, head, "--format", "json")
    assert code == 3
    assert json.loads(out)["verdict"] == "incomparable"


@pytest.mark.parametrize("status", [RunStatus.CRASHED, RunStatus.COMPLETED])
def test_a_head_that_traced_nothing_never_passes(tmp_path, capsys, status):
    """A head killed before its first step, or that never imported torch, against a good base:
    the gate used to say warn, exit 0 -- a pass for a run that measured nothing."""
    head = write_fallback_summary(tmp_path / "head.json", "smoke", time.time(), status)
    code, out, _ = run(capsys, A, head)
    assert code == 3
    assert out.startswith("traceml-ci incomparable: ")
    assert f"head analysed no steps ({status.value}, 0 steps in all" in out
    code, out, _ = run(capsys, head, A)  # nor a base that measured nothing
    assert code == 3 and "base analysed no steps" in out


def test_env_mismatch_is_skipped_unless_allowed(tmp_path, capsys):
    base = dump(tmp_path / "b.json", make(device_type="cuda", device_name="A100"))
    head = dump(tmp_path / "h.json", make({k: v * 2 for k, v in make()["step_time"]["phase_ms"]
                                           .items()}, device_type="cuda", device_name="H100"))
    assert run(capsys, base, head)[0] == 0
    assert run(capsys, base, head, "--allow-env-mismatch")[0] == 1


def test_markdown_to_an_output_file(tmp_path, capsys):
    base = dump(tmp_path / "b.json", make())
    head = dump(tmp_path / "h.json", make(shift(dataloader=4.0)))
    report = tmp_path / "out" / "comment.md"
    code, out, err = run(capsys, base, head, "--format", "markdown", "--output", report)
    assert code == 1
    assert out == ""
    assert err == f"traceml-ci: regression (report in {report})\n"
    assert report.read_text().splitlines()[0] == MARKER


def test_json_format_is_the_comparison(capsys):
    code, out, _ = run(capsys, A, B, "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["kind"] == "comparison" and doc["verdict"] == "pass"


def test_baseline_sets_match_keys(tmp_path, capsys):
    base, head = tmp_path / "base.json", tmp_path / "head.json"
    write_baseline_set(base, {"t::a": make(), "t::b": make(), "t::gone": make()})
    write_baseline_set(head, {"t::a": make(), "t::b": make(shift(other=6.0)), "t::new": make()})
    code, out, _ = run(capsys, base, head, "--format", "json")
    doc = json.loads(out)
    assert code == 1
    assert doc["added"] == ["t::new"] and doc["removed"] == ["t::gone"]
    assert doc["items"]["t::b"]["verdict"] == "regression"


def test_single_summary_against_a_one_key_set(tmp_path, capsys):
    base = tmp_path / "base.json"
    write_baseline_set(base, {"tests/test_x.py::test_x": make()})
    head = dump(tmp_path / "h.json", make())
    code, out, _ = run(capsys, base, head, "--format", "json")
    assert code == 0 and json.loads(out)["kind"] == "comparison"


def test_traceml_ai_inputs(capsys):
    code, out, _ = run(capsys, TRACEML_AI / "compute_bound.json",
                       TRACEML_AI / "input_bound.json", "--format", "markdown")
    assert code == 1
    assert "base was mapped from traceml-ai (schema 1.9); not mapped:" in out


def test_tolerances_file_and_pyproject(tmp_path, capsys):
    base = dump(tmp_path / "b.json", make())
    head = dump(tmp_path / "h.json", make(shift(dataloader=4.0)))
    loose = tmp_path / "loose.toml"
    loose.write_text('[tolerances]\n"step_time.*" = {fail = false}\n'
                     '"step_memory.*" = {fail = false}\n')
    assert run(capsys, base, head, "--tolerances", loose)[0] == 0
    (tmp_path / "pyproject.toml").write_text(
        '[tool.traceml-ci.tolerances]\n"step_time.*" = {fail = false}\n'
    )
    code, out, _ = run(capsys, base, head)
    assert code == 0
    assert "pyproject.toml [tool.traceml-ci]" in out


@pytest.mark.parametrize(("table", "problem"), [
    ('[tool.traceml-ci.tolerance]\n"step_time.*" = {fail = false}\n',
     "$: unknown key 'tolerance' (allowed: noise_factor, noise_rule, tolerances)"),
    ("[tool.traceml-ci]\nnoise_factr = 3\n", "$: unknown key 'noise_factr'"),
    ('[tool.traceml-ci.tolerances]\n"step_time.*" = {fial = false}\n', "unknown key 'fial'"),
])
def test_a_typo_under_tool_traceml_ci_is_an_error_exit_2(tmp_path, capsys, table, problem):
    base = dump(tmp_path / "b.json", make())
    head = dump(tmp_path / "h.json", make(shift(dataloader=4.0)))
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n' + table)
    code, out, err = run(capsys, base, head)
    assert code == 2 and out == ""
    assert err.startswith(f"traceml-ci: error: {tmp_path / 'pyproject.toml'}: invalid rules: ")
    assert problem in err and len(err.strip().splitlines()) == 1


def test_a_pyproject_without_the_table_or_with_an_empty_one_uses_the_defaults(tmp_path, capsys):
    base = dump(tmp_path / "b.json", make())
    head = dump(tmp_path / "h.json", make(shift(dataloader=4.0)))
    for text in ('[project]\nname = "x"\n', "[tool.traceml-ci]\n", "[tool.other]\nx = 1\n"):
        (tmp_path / "pyproject.toml").write_text(text)
        code, out, _ = run(capsys, base, head)
        assert code == 1 and "rules: defaults" in out


def _pcts_250(doc):
    for p in ("dataloader", "forward", "backward", "optimizer", "other"):
        doc["step_time"][f"{p}_pct"] = 50.0
    return doc


def _pct_strings(doc):
    doc["step_time"]["dataloader_pct"] = "79.7"
    return doc


def _negative(doc):
    doc["step_time"]["phase_ms"]["forward"] = -1.0
    return doc


def _no_step_time(doc):
    del doc["step_time"]
    return doc


def _newer(doc):
    doc["schema_version"] = "7.0"
    return doc


BAD_INPUTS = {
    "empty file": (b"", "file is empty"),
    "not JSON": (b"{'single': quotes}", "not valid JSON: Expecting property name"),
    "a JSON array": (b"[]", "expected a JSON object (a summary or a baseline set), got a JSON "
                     "array"),
    "missing step_time": (_no_step_time, "invalid summary: $: 'step_time' is a required "
                          "property"),
    "pct as strings": (_pct_strings, "$.step_time.dataloader_pct: '79.7' is not of type"),
    "NaN": (b'{"step_time": {"dataloader_pct": NaN}}', "NaN is not valid JSON"),
    "Infinity": (b'{"step_time": {"step_ms": Infinity}}', "Infinity is not valid JSON"),
    "negative time": (_negative, "$.step_time.phase_ms.forward: -1.0 is less than the minimum"),
    "pcts sum to 250": (_pcts_250, "the five *_pct add up to 250, not 100"),
    "newer major schema": (_newer, "schema version 7.0 is newer than this traceml-ci reads"),
    "missing file": (None, "cannot read: No such file or directory"),
}


@pytest.mark.parametrize("side", ["base", "head"])
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_each_bad_input_is_one_stderr_line_naming_file_and_problem_exit_2(
        tmp_path, capsys, case, side):
    content, problem = BAD_INPUTS[case]
    bad = tmp_path / "bad.json"
    if callable(content):
        dump(bad, content(real()))
    elif content is not None:
        bad.write_bytes(content)
    args = (bad, A) if side == "base" else (A, bad)
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"traceml-ci: error: {bad}: ")
    assert problem in err
    assert "Traceback" not in err


def test_a_100_mb_file(tmp_path, capsys):
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as fh:
        fh.truncate(100 * 1024 * 1024)
    code, _, err = run(capsys, A, huge)
    assert code == 2
    assert err == f"traceml-ci: error: {huge}: file is 104.9 MB, over the 10 MB limit\n"


@pytest.mark.parametrize(
    ("rules", "problem"),
    [
        ('[tolerances]\n"step_time.*_pct" = {abs = 2, typo = 1}\n',
         'invalid rules: $.tolerances["step_time.*_pct"]: unknown key \'typo\''),
        ("colour = 'red'\n", "invalid rules: $: unknown key 'colour'"),
        ('[tolerances]\n"step_time.*_pct" = {abs = -2.0}\n',
         'invalid rules: $.tolerances["step_time.*_pct"].abs: -2.0 is less than the minimum'),
        ("[tolerances\n", "not valid TOML"),
    ],
)
def test_bad_rules_file_is_exit_2_naming_the_rules_file(tmp_path, capsys, rules, problem):
    f = tmp_path / "rules.toml"
    f.write_text(rules)
    code, out, err = run(capsys, A, B, "--tolerances", f)
    assert code == 2 and out == ""
    assert err.startswith(f"traceml-ci: error: {f}: ")
    assert problem in err and err.count("\n") == 1


def test_real_subprocess_exit_codes_and_stderr(tmp_path):
    exe = [str(Path(sys.executable).with_name("traceml-ci"))]  # the installed console script
    env = {**os.environ, "NO_COLOR": "1"}
    ok = subprocess.run([*exe, "diff", str(A), str(B)], capture_output=True, text=True,
                        env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("traceml-ci pass")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2, 3]")
    res = subprocess.run([*exe, "compare", str(A), str(bad)], capture_output=True, text=True,
                         env=env, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr == (f"traceml-ci: error: {bad}: expected a JSON object (a summary or a "
                          "baseline set), got a JSON array\n")
    head = tmp_path / "head.json"
    head.write_text(json.dumps(make(shift(dataloader=4.0))))
    base = tmp_path / "base.json"
    base.write_text(json.dumps(make()))
    reg = subprocess.run([*exe, "diff", "--format", "markdown", str(base), str(head)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert reg.returncode == 1
    assert reg.stdout.splitlines()[0] == MARKER


def test_help_lists_formats_and_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["diff", "--help"])
    out = capsys.readouterr().out
    assert "--tolerances" in out and "--allow-env-mismatch" in out
    assert "1 regression" in out and "3 incomparable" in out


def test_unwritable_output_is_bad_input_not_a_regression(tmp_path, capsys):
    code = main(["diff", str(A), str(B), "--output", str(tmp_path)])  # a directory
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"traceml-ci: error: {tmp_path}: cannot write")
