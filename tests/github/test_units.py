"""Pure pieces: markers and trimming, runner files, the event context, the gate's decisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.github.composite import Expr, parse_outputs
from traceml_ci.cli.action_gate import (
    CommentPolicy,
    NoVerdict,
    _comparison_verdict,
    _out_dir,
    comment_here,
    decide_failure,
    intended_comment,
)
from traceml_ci.cli.comment import CommentMode, _without_report_marker
from traceml_ci.gate import Verdict
from traceml_ci.gate.render.comparison import MARKER
from traceml_ci.github.context import GitHubContext
from traceml_ci.github.runner import (
    STEP_SUMMARY_LIMIT_BYTES,
    annotation,
    append_step_summary,
    format_outputs,
)
from traceml_ci.github.sticky import (
    TRIM_NOTE,
    compose_body,
    gh_len,
    marker_for,
    marker_id,
)

# -- sticky ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "expected"),
    [("smoke", "smoke"), ("gpu/a100", "gpu/a100"), ("a --> b", "a_--_b"), ("", "default"),
     ("<!--x-->", "--x--"), ("é", "default")],
)  # fmt: skip
def test_marker_ids_cannot_break_the_html_comment(job: str, expected: str) -> None:
    assert marker_id(job) == expected
    assert marker_for(job).count("-->") == 1


def test_compose_replaces_the_generic_marker() -> None:
    body = compose_body(_without_report_marker(f"{MARKER}\nreport\n"), marker_for("j"))
    assert body == f"{marker_for('j')}\nreport\n"
    assert compose_body("\ufeffplain\r\ntext", "M") == "M\nplain\ntext\n"


@pytest.mark.parametrize("limit", [300, 1000, 4096])
def test_trim_fits_closes_blocks_and_says_so(limit: int) -> None:
    rows = "".join(f"| row {i} | 🐢 |\n" for i in range(400))
    report = f"verdict\n<details>\n\n```\ncode\n{rows}```\n</details>\n"
    body = compose_body(report, "M", limit=limit)
    assert gh_len(body) <= limit
    assert body.endswith(TRIM_NOTE + "\n")
    kept = body[: -len(TRIM_NOTE) - 1]
    assert kept.count("```") % 2 == 0
    assert kept.count("<details>") == kept.count("</details>")


def test_gh_len_counts_astral_characters_twice() -> None:
    assert gh_len("a🐢") == 3


# -- runner files ----------------------------------------------------------------------------


def test_outputs_round_trip_including_multiline() -> None:
    values = {"verdict": "pass", "reason": "line one\nline two", "empty": ""}
    text = format_outputs(values)
    assert parse_outputs(text) == values
    assert "ghadelimiter_" in text


def test_step_summary_is_appended_and_capped(tmp_path: Path) -> None:
    path = tmp_path / "summary.md"
    append_step_summary(path, "first")
    append_step_summary(path, "second\n")
    assert path.read_text() == "first\nsecond\n"
    append_step_summary(path, ("x" * 99 + "\n") * 20_000)  # 2 MB
    text = path.read_text()
    assert len(text.encode()) <= STEP_SUMMARY_LIMIT_BYTES
    assert text.startswith("first\nsecond\n") and "1 MiB job-summary limit" in text


def test_annotations_escape_their_data() -> None:
    line = annotation("error", "50% slower\nsee: summary", title="a,b:c")
    assert line == "::error title=a%2Cb%3Ac::50%25 slower%0Asee: summary"


# -- context ---------------------------------------------------------------------------------


def ctx_for(tmp_path: Path, event_name: str, event: dict) -> GitHubContext:
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))
    env = {"GITHUB_EVENT_NAME": event_name, "GITHUB_EVENT_PATH": str(path),
           "GITHUB_TOKEN": "secret", "GITHUB_REPOSITORY": "o/r"}  # fmt: skip
    return GitHubContext.from_environ(env)


@pytest.mark.parametrize(
    ("name", "event", "number"),
    [
        ("pull_request", {"number": 3, "pull_request": {"number": 3}}, 3),
        ("pull_request_target", {"pull_request": {"number": 4}}, 4),
        ("issue_comment", {"issue": {"number": 5, "pull_request": {}}}, 5),
        ("issue_comment", {"issue": {"number": 5}}, None),  # an issue, not a pull request
        ("workflow_run", {"workflow_run": {"pull_requests": [{"number": 6}]}}, 6),
        ("workflow_run", {"workflow_run": {"pull_requests": []}}, None),  # from a fork
        ("push", {"ref": "refs/heads/main"}, None),
        ("pull_request", {"pull_request": {"number": "7"}}, None),
    ],
)
def test_pull_request_number(tmp_path: Path, name: str, event: dict, number) -> None:
    assert ctx_for(tmp_path, name, event).pull_request_number() == number


def test_context_outside_actions_and_token_hidden() -> None:
    ctx = GitHubContext.from_environ({"GITHUB_TOKEN": "secret"})
    assert ctx.event == {} and ctx.pull_request_number() is None
    assert ctx.api_url == "https://api.github.com"
    assert "secret" not in repr(ctx)


def test_the_actions_files_go_under_runner_temp_from_the_context(tmp_path: Path) -> None:
    """RUNNER_TEMP is GitHub's variable: the context carries it, and the Action's folder is
    named from what the context says (an empty value is unset, like the GITHUB_* ones)."""
    ctx = GitHubContext.from_environ({"RUNNER_TEMP": str(tmp_path)})
    assert ctx.runner_temp == str(tmp_path)
    assert GitHubContext.from_environ({"RUNNER_TEMP": ""}).runner_temp is None
    out = _out_dir("", "smoke/job", ctx.runner_temp)
    assert out == tmp_path / "traceml-ci" / "smoke-job" and out.is_dir()
    given = tmp_path / "given"
    assert _out_dir(str(given), "smoke/job", ctx.runner_temp) == given


def test_fork_detection(tmp_path: Path) -> None:
    def pr(head: str) -> dict:
        return {"pull_request": {"number": 1, "head": {"repo": {"full_name": head}},
                                 "base": {"repo": {"full_name": "o/r"}}}}  # fmt: skip

    assert ctx_for(tmp_path, "pull_request", pr("fork/r")).is_fork_pull_request()
    assert not ctx_for(tmp_path, "pull_request", pr("o/r")).is_fork_pull_request()


# -- gate decisions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ('{"verdict": "pass"}', Verdict.PASS),
        ('{"verdict": "warn"}', Verdict.WARN),
        ('{"verdict": "regression"}', Verdict.REGRESSION),
        ('{"verdict": "incomparable"}', Verdict.INCOMPARABLE),
        ('{"verdict": "no-baseline"}', NoVerdict.ERROR),  # not a verdict of the gate's
        ('{"verdict": "???"}', NoVerdict.ERROR),
        ("[]", NoVerdict.ERROR),
        ("{not json", NoVerdict.ERROR),
        (None, NoVerdict.ERROR),  # the plugin wrote none
    ],
)
def test_the_verdict_is_read_from_the_plugins_comparison(
    tmp_path: Path, text: str | None, verdict
) -> None:
    path = tmp_path / "comparison.json"
    if text is not None:
        path.write_text(text)
    assert _comparison_verdict(path) is verdict


@pytest.mark.parametrize(
    ("verdict", "pytest_exit", "fail_on_regression", "failed"),
    [
        (Verdict.PASS, 0, True, False),
        (Verdict.WARN, 0, True, False),
        (NoVerdict.NO_BASELINE, 0, True, False),
        (Verdict.INCOMPARABLE, 0, True, False),
        (Verdict.REGRESSION, 1, True, True),
        (Verdict.REGRESSION, 0, True, True),
        (Verdict.REGRESSION, 0, False, False),
        (Verdict.REGRESSION, 1, False, True),  # a real test failure still fails
        (Verdict.PASS, 2, True, True),
        (NoVerdict.ERROR, 0, False, True),
    ],
)
def test_decide_failure(verdict, pytest_exit, fail_on_regression, failed) -> None:
    result = decide_failure(verdict, pytest_exit, fail_on_regression)
    assert result.failed is failed
    assert bool(result.reason) is failed


@pytest.mark.parametrize(
    ("policy", "verdict", "mode"),
    [
        (CommentPolicy.NEVER, Verdict.REGRESSION, CommentMode.SKIP),
        (CommentPolicy.ALWAYS, Verdict.PASS, CommentMode.UPSERT),
        (CommentPolicy.ON_REGRESSION, Verdict.REGRESSION, CommentMode.UPSERT),
        (CommentPolicy.ON_REGRESSION, Verdict.PASS, CommentMode.UPDATE),
        (CommentPolicy.ON_REGRESSION, NoVerdict.ERROR, CommentMode.UPDATE),
    ],
)
def test_intended_comment(policy, verdict, mode) -> None:
    assert intended_comment(policy, verdict) is mode


def test_comment_here_only_on_same_repo_pull_requests(tmp_path: Path) -> None:
    pr = {"pull_request": {"number": 1}}
    assert comment_here(CommentMode.UPSERT, ctx_for(tmp_path, "push", {}))[0] is CommentMode.SKIP
    here = comment_here(CommentMode.UPDATE, ctx_for(tmp_path, "pull_request", pr))
    assert here == (CommentMode.UPDATE, "")


# -- the test harness's own expression evaluator ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("steps.gate.outputs.mode == 'upsert' || steps.gate.outputs.mode == 'update'", True),
        ("!cancelled() && inputs.up == 'true' && steps.gate.outputs.dir != ''", True),
        ("steps.nope.outputs.x == ''", True),
        ("!(inputs.up == 'true')", False),
        ("success()", True),
    ],
)
def test_expression_subset(text: str, value: bool) -> None:
    gate = {"outputs": {"mode": "update", "dir": "/d"}}
    ctx = {"steps": {"gate": gate}, "inputs": {"up": "true"}}
    status = {"success": True, "failure": False, "always": True, "cancelled": False}
    assert Expr(ctx, status).eval(text) is value
