"""``traceml-ci comment`` end to end against a real HTTP server standing in for GitHub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.github.conftest import PR, REPO, TOKEN
from tests.github.fake_github import FakeGitHub
from traceml_ci.cli.main import main
from traceml_ci.gate.render.comparison import MARKER as REPORT_MARKER
from traceml_ci.github.sticky import (
    COMMENT_LIMIT,
    CREATE_RECHECK_DELAY_S,
    gh_len,
    marker_for,
)

REPORT = f"{REPORT_MARKER}\n**traceml-ci: pass**\n\n| metric | base | head |\n|---|---|---|\n"


def comment(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["comment", *args])
    out, err = capsys.readouterr()
    assert TOKEN not in out and TOKEN not in err
    return code, out, err


@pytest.fixture
def body(tmp_path: Path) -> Path:
    path = tmp_path / "report.md"
    path.write_text(REPORT, encoding="utf-8")
    return path


def test_creates_then_updates_in_place(gh_env: FakeGitHub, body: Path, capsys) -> None:
    code, out, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 0, err
    assert "created on octo/widgets#7" in out
    [first] = gh_env.bodies(REPO, PR)
    assert first.splitlines()[0] == marker_for("smoke")
    assert REPORT_MARKER not in first  # the generic marker gives way to the job's

    body.write_text(REPORT.replace("pass", "regression"), encoding="utf-8")
    code, out, _ = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 0 and "updated" in out
    [only] = gh_env.bodies(REPO, PR)
    assert "regression" in only
    mine = gh_env.comments[(REPO, PR)][0]["id"]
    # the second run asks who the token is (GET /user) once it sees a comment with its marker
    calls = [(r.method, r.path.rsplit("/", 1)[-1]) for r in gh_env.requests]
    assert calls == [("GET", "comments"), ("POST", "comments"), ("GET", "comments"),
                     ("GET", "user"), ("PATCH", str(mine))]  # fmt: skip
    assert all(r.authorization == f"Bearer {TOKEN}" for r in gh_env.requests)

    code, out, _ = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 0 and "unchanged" in out
    assert gh_env.requests[-1].method == "GET"  # no needless edit


def test_finds_its_comment_past_the_first_page(gh_env: FakeGitHub, body: Path, capsys) -> None:
    gh_env.page_size = 2
    for i in range(5):
        gh_env.add_comment(REPO, PR, f"chatter {i}")
    gh_env.add_comment(REPO, PR, f"> {marker_for('smoke')}\n> quoted by a human")
    mine = gh_env.add_comment(REPO, PR, marker_for("smoke") + "\nold", "github-actions[bot]")
    gh_env.add_comment(REPO, PR, marker_for("other-job") + "\nother job's report")

    code, out, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 0, err
    assert f"comment {mine} updated" in out
    lists = [r for r in gh_env.requests if r.method == "GET" and r.path != "/user"]
    assert [r.query.get("page", ["1"])[0] for r in lists] == ["1", "2", "3", "4"]
    assert len(gh_env.bodies(REPO, PR)) == 8


def test_markers_keep_jobs_apart(gh_env: FakeGitHub, body: Path, capsys) -> None:
    for job in ("cpu", "gpu", "cpu"):
        assert comment(capsys, "--body", str(body), "--pr", str(PR), "--marker", job)[0] == 0
    assert len(gh_env.bodies(REPO, PR)) == 2


def test_update_mode_never_creates(gh_env: FakeGitHub, body: Path, capsys) -> None:
    code, out, _ = comment(capsys, "--body", str(body), "--pr", str(PR), "--mode", "update")
    assert code == 0 and "skipped" in out
    assert gh_env.bodies(REPO, PR) == []


def test_pr_number_from_the_event_file(gh_env, body, tmp_path, monkeypatch, capsys) -> None:
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"number": PR, "pull_request": {"number": PR}}))
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    assert comment(capsys, "--body", str(body))[0] == 0
    assert len(gh_env.bodies(REPO, PR)) == 1


def test_server_error_then_success(gh_env: FakeGitHub, body: Path, capsys, monkeypatch) -> None:
    slept: list[float] = []  # recorded, not waited: the test takes milliseconds, not 2 s
    monkeypatch.setattr("traceml_ci.github.client.time.sleep", slept.append)
    gh_env.fail_next("GET", 502, "Bad Gateway")
    gh_env.fail_next("POST", 500, "Internal Server Error")
    code, out, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 0, err
    assert slept[-1] == CREATE_RECHECK_DELAY_S  # waited before looking for the lost create
    # list (502, retried), create (500: did it land?), list again, create.
    assert [r.method for r in gh_env.requests] == ["GET", "GET", "POST", "GET", "POST"]
    assert len(gh_env.bodies(REPO, PR)) == 1


def test_secondary_rate_limit_is_retried_once(gh_env, body, capsys, monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("traceml_ci.github.client.time.sleep", slept.append)
    gh_env.fail_next("POST", 403, "You have exceeded a secondary rate limit", {"Retry-After": "3"})
    assert comment(capsys, "--body", str(body), "--pr", str(PR))[0] == 0
    assert slept == [3.0]
    assert len(gh_env.bodies(REPO, PR)) == 1


@pytest.mark.parametrize(
    ("message", "headers"),
    [("You have exceeded a secondary rate limit", {"Retry-After": "NaN"}),
     ("API rate limit exceeded",
      {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "99999999999999999999"})],
    ids=["Retry-After NaN", "reset far in the future"],
)
def test_a_nonsense_rate_limit_header_is_exit_5_one_line(gh_env, body, capsys, message,
                                                         headers) -> None:
    """The real sleep: NaN reached time.sleep (ValueError), a far reset time.gmtime
    (OverflowError), each exit 4. Now the API error it is: exit 5, one line, no wait."""
    gh_env.fail_next("GET", 403, message, headers)
    code, out, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert (code, err.count("\n")) == (5, 1), err
    assert "internal error" not in err and len(gh_env.requests) == 1


def test_persistent_server_error_is_exit_5(gh_env: FakeGitHub, body: Path, capsys) -> None:
    gh_env.fail_next("GET", 500, "Internal Server Error")
    gh_env.fail_next("GET", 503, "Service Unavailable")
    code, out, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 5
    assert err.count("\n") == 1 and "503 Service Unavailable" in err
    assert len(gh_env.requests) == 2  # one retry, not more


def test_bad_token_is_exit_5_and_never_printed(gh_env, body, monkeypatch, capsys) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_WRONGtoken")
    code, out, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 5
    assert err.startswith("traceml-ci: error: GitHub API:") and err.count("\n") == 1
    assert "401 Bad credentials" in err and "GITHUB_TOKEN" in err
    assert "ghp_WRONGtoken" not in out + err


def test_forbidden_hints_at_permissions(gh_env: FakeGitHub, body: Path, capsys) -> None:
    gh_env.fail_next("POST", 403, "Resource not accessible by integration")
    code, _, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 5
    assert "pull-requests: write" in err and err.count("\n") == 1


def test_not_found_names_repo_and_pr(gh_env: FakeGitHub, body: Path, capsys) -> None:
    code, _, err = comment(capsys, "--body", str(body), "--repo", "octo/gone", "--pr", "99")
    assert code == 5
    assert "octo/gone#99" in err and "not found" in err and err.count("\n") == 1


def test_very_long_body_is_trimmed_with_a_note(gh_env: FakeGitHub, tmp_path, capsys) -> None:
    rows = "".join(f"| metric_{i} | 1.0 | 2.0 | 🐢 |\n" for i in range(6000))
    big = tmp_path / "big.md"
    big.write_text(f"{REPORT}<details><summary>unchanged</summary>\n\n{rows}</details>\n")
    assert comment(capsys, "--body", str(big), "--pr", str(PR))[0] == 0
    [posted] = gh_env.bodies(REPO, PR)
    assert gh_len(posted) <= COMMENT_LIMIT
    assert "65,536-character comment limit" in posted
    assert posted.count("<details>") == posted.count("</details>") == 1
    assert posted.splitlines()[0] == marker_for("smoke")


def test_expect_head_sha_guards_the_pr_number(gh_env: FakeGitHub, body: Path, capsys) -> None:
    args = ("--body", str(body), "--pr", str(PR), "--expect-head-sha")
    code, out, _ = comment(capsys, *args, "b" * 40)
    assert code == 0 and "not commenting" in out
    assert gh_env.bodies(REPO, PR) == []
    assert comment(capsys, *args, "a" * 40)[0] == 0
    assert len(gh_env.bodies(REPO, PR)) == 1


def write_meta(path: Path, **fields: object) -> Path:
    meta = {"kind": "traceml-ci/comment-meta", "pr": PR, "marker": "gpu", "mode": "upsert"}
    path.write_text(json.dumps({**meta, **fields}))
    return path


def workflow_run_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head_sha: str) -> None:
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"workflow_run": {"head_sha": head_sha, "pull_requests": []}}))
    monkeypatch.setenv("GITHUB_EVENT_NAME", "workflow_run")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))


def test_meta_from_an_artifact_in_a_workflow_run_job(gh_env, body, tmp_path, monkeypatch, capsys):
    meta = write_meta(tmp_path / "comment.json")
    workflow_run_event(tmp_path, monkeypatch, "a" * 40)
    code, out, err = comment(capsys, "--body", str(body), "--meta", str(meta))
    assert code == 0, err
    [posted] = gh_env.bodies(REPO, PR)
    assert posted.startswith(marker_for("gpu"))
    assert gh_env.requests[0].path == f"/repos/{REPO}/pulls/{PR}"


def test_meta_naming_another_pr_is_not_trusted(gh_env, body, tmp_path, monkeypatch, capsys):
    gh_env.add_pr(REPO, 8, head_sha="c" * 40)  # someone else's pull request
    meta = write_meta(tmp_path / "comment.json", pr=8)
    workflow_run_event(tmp_path, monkeypatch, "a" * 40)
    code, out, _ = comment(capsys, "--body", str(body), "--meta", str(meta))
    assert code == 0 and "not commenting" in out
    assert gh_env.bodies(REPO, 8) == []


def test_meta_mode_skip_does_nothing(gh_env, body, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("GITHUB_TOKEN")  # not even needed
    meta = write_meta(tmp_path / "comment.json", mode="skip")
    code, out, _ = comment(capsys, "--body", str(body), "--meta", str(meta))
    assert code == 0 and "skipped" in out
    assert gh_env.requests == []


def test_body_token_is_masked(gh_env: FakeGitHub, tmp_path: Path, capsys) -> None:
    leaky = tmp_path / "leaky.md"
    leaky.write_text(f"{REPORT}\nenv dump: GITHUB_TOKEN={TOKEN}\n")
    assert comment(capsys, "--body", str(leaky), "--pr", str(PR))[0] == 0
    [posted] = gh_env.bodies(REPO, PR)
    assert TOKEN not in posted and "GITHUB_TOKEN=***" in posted


@pytest.mark.parametrize(
    ("meta", "problem"),
    [
        ('{"kind": "other"}', "not a traceml-ci/comment-meta file"),
        ("[1", "not valid JSON"),
        ('{"kind": "traceml-ci/comment-meta", "pr": -3, "marker": "x", "mode": "upsert"}', "pr -3"),
        ('{"kind": "traceml-ci/comment-meta", "pr": 7, "marker": "x", "mode": "post"}', "mode"),
    ],
)
def test_bad_meta_is_exit_2(gh_env, body, tmp_path, capsys, meta, problem) -> None:
    path = tmp_path / "comment.json"
    path.write_text(meta)
    code, _, err = comment(capsys, "--body", str(body), "--meta", str(path))
    assert code == 2 and problem in err and err.count("\n") == 1


def test_symlinked_artifact_files_are_refused(gh_env, body, tmp_path, capsys) -> None:
    meta = write_meta(tmp_path / "comment.json")
    link = tmp_path / "link.md"
    link.symlink_to(body)
    code, _, err = comment(capsys, "--body", str(link), "--meta", str(meta))
    assert code == 2 and "symbolic link" in err
    assert gh_env.requests == []


@pytest.mark.parametrize(
    ("unset", "args", "problem"),
    [
        ("GITHUB_TOKEN", ["--pr", "7"], "GITHUB_TOKEN is not set"),
        ("GITHUB_REPOSITORY", ["--pr", "7"], "no repository"),
        (None, [], "no pull request number"),
        (None, ["--pr", "7", "--repo", "not a repo"], "is not OWNER/NAME"),
        (None, ["--pr", "0"], "is not a pull request number"),
    ],
)
def test_usage_errors_are_exit_2(gh_env, body, monkeypatch, capsys, unset, args, problem) -> None:
    if unset:
        monkeypatch.delenv(unset)
    code, out, err = comment(capsys, "--body", str(body), *args)
    assert code == 2
    assert problem in err and err.count("\n") == 1
    assert gh_env.requests == []


@pytest.mark.parametrize("content", [None, b"", b"\xff\xfe broken"])
def test_unusable_body_file_is_exit_2(gh_env, tmp_path, capsys, content) -> None:
    path = tmp_path / "report.md"
    if content is not None:
        path.write_bytes(content)
    code, _, err = comment(capsys, "--body", str(path), "--pr", str(PR))
    assert code == 2
    assert str(path) in err and err.count("\n") == 1
    assert gh_env.requests == []


def test_unreadable_event_file_is_exit_2(gh_env, body, tmp_path, monkeypatch, capsys) -> None:
    event = tmp_path / "event.json"
    event.write_text("{not json")
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    code, _, err = comment(capsys, "--body", str(body))
    assert code == 2 and f"{event} (GITHUB_EVENT_PATH): not valid JSON" in err


def _cli(*args: str, stdin=subprocess.DEVNULL, env: dict[str, str] | None = None):
    """The CLI in a real process, with a deadline: a read that blocks fails the test, not the
    suite (subprocess.run kills the child on the timeout)."""
    code = "import sys; from traceml_ci.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "comment", *args], stdin=stdin,
                          capture_output=True, text=True, env=env or dict(os.environ), timeout=60)


def _one_line_exit_2(proc, *expected: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    for text in expected:
        assert text in proc.stderr


@pytest.fixture
def fifo(tmp_path: Path):
    """A named pipe a writer holds open and never writes to: reading it would wait forever."""
    path = tmp_path / "stream"
    os.mkfifo(path)
    writer = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    yield path
    os.close(writer)


@pytest.mark.parametrize("option", ["--body", "--meta"])
def test_a_device_or_a_fifo_as_body_or_meta_is_refused_at_once(gh_env, body, fifo, option):
    args = ["--pr", str(PR)] if option == "--body" else ["--body", str(body)]
    for path, kind in (("/dev/zero", "character device"), (str(fifo), "named pipe")):
        proc = _cli(option, path, *args)
        _one_line_exit_2(proc, f"{path}: is a {kind}")
    assert gh_env.requests == []


def test_a_100_mb_body_is_refused_without_reading_it(gh_env, tmp_path) -> None:
    from traceml_ci.summary.io import MAX_COMMENT_BODY_BYTES

    huge = tmp_path / "huge.md"
    with open(huge, "wb") as fh:  # sparse: 100 MB that costs no disk
        fh.write(REPORT.encode())
        fh.truncate(100 * 1024 * 1024)
    proc = _cli("--body", str(huge), "--pr", str(PR))
    _one_line_exit_2(proc, str(huge), f"over the {MAX_COMMENT_BODY_BYTES / 1e6:.0f} MB limit")
    assert gh_env.requests == []


def test_an_endless_stdin_body_is_cut_off_at_the_limit(gh_env) -> None:
    with open("/dev/zero", "rb") as zero:
        proc = _cli("--body", "-", "--pr", str(PR), stdin=zero)
    _one_line_exit_2(proc, "--body - (stdin)", "over the limit")
    assert gh_env.requests == []


def test_a_body_from_stdin_is_posted(gh_env) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "traceml_ci", "comment", "--body", "-", "--pr", str(PR)],
        input=REPORT, capture_output=True, text=True, env=dict(os.environ), timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    [posted] = gh_env.bodies(REPO, PR)
    assert "**traceml-ci: pass**" in posted


def test_a_deeply_nested_meta_is_one_line_exit_2(gh_env, body, tmp_path) -> None:
    meta = tmp_path / "comment.json"
    meta.write_text("[" * 20_000 + "]" * 20_000)  # 40 KB: under the size limit
    proc = _cli("--body", str(body), "--meta", str(meta))
    _one_line_exit_2(proc, str(meta), "nested too deeply")


def test_a_fifo_or_device_as_the_event_file_is_refused_at_once(gh_env, body, fifo) -> None:
    for path, kind in (("/dev/zero", "character device"), (str(fifo), "named pipe")):
        env = {**os.environ, "GITHUB_EVENT_NAME": "pull_request", "GITHUB_EVENT_PATH": path}
        proc = _cli("--body", str(body), env=env)
        _one_line_exit_2(proc, f"{path} (GITHUB_EVENT_PATH): is a {kind}")
    assert gh_env.requests == []


def test_an_event_file_with_a_long_pr_body_is_read(gh_env, body, tmp_path, monkeypatch, capsys):
    """Event payloads are read bounded, but their strings (a PR's description) are not limited
    like a summary's."""
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": PR, "body": "x" * 200_000}}))
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    code, out, err = comment(capsys, "--body", str(body))
    assert code == 0, err
    assert len(gh_env.bodies(REPO, PR)) == 1


def test_real_process_prints_no_traceback_and_no_token(gh_env: FakeGitHub, body: Path) -> None:
    gh_env.fail_next("POST", 403, f"Resource not accessible; token {TOKEN} echoed back")
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from traceml_ci.cli.main import main; "
         "sys.exit(main(sys.argv[1:]))", "comment", "--body", str(body), "--pr", str(PR)],
        capture_output=True, text=True, env=dict(os.environ), timeout=60,
    )  # fmt: skip
    assert proc.returncode == 5
    assert "Traceback" not in proc.stderr
    assert TOKEN not in proc.stdout + proc.stderr
    assert "***" in proc.stderr


def test_api_url_without_a_scheme_is_one_line_exit_5(gh_env, body, capsys, monkeypatch) -> None:
    monkeypatch.setenv("GITHUB_API_URL", "ghe.example.com/api/v3")
    code, out, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 5, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("padded", [f"{TOKEN}\n", f"  {TOKEN}\r\n", f"\t{TOKEN} \n\n"])
def test_a_token_with_surrounding_whitespace_is_stripped_and_never_printed(
    gh_env, body, monkeypatch, capsys, padded
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", padded)
    code, out, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 0, err
    assert "created on octo/widgets#7" in out
    assert all(r.authorization == f"Bearer {TOKEN}" for r in gh_env.requests)


@pytest.mark.parametrize(
    "bad",
    [
        f"{TOKEN}\r\nX-Injected: 1",
        f"{TOKEN[:12]}\n{TOKEN[12:]}",
        f"{TOKEN}\x1b[2J",
        f"{TOKEN} extra",
    ],
)
def test_a_token_with_inner_control_characters_is_refused_without_printing_it(
    gh_env, body, monkeypatch, capsys, bad
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", bad)
    code, out, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "GITHUB_TOKEN" in err
    for piece in (TOKEN, TOKEN[:12], TOKEN[12:], "X-Injected"):
        assert piece not in out + err
    assert gh_env.requests == []  # nothing was sent with it


def test_a_server_echoing_the_request_never_gets_the_token_printed(
    gh_env, body, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", f"{TOKEN}\n")
    gh_env.fail_next("GET", 400, "bad request", echo=True)
    code, out, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 5, err
    assert len(err.strip().splitlines()) == 1
    assert "Authorization: Bearer ***" in err and "auth=Bearer%20***" in err


def test_the_body_is_masked_with_the_stripped_token(gh_env, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GITHUB_TOKEN", f"{TOKEN}\n")
    leaky = tmp_path / "leaky.md"
    leaky.write_text(f"{REPORT}\nenv dump: GITHUB_TOKEN={TOKEN}\n")
    assert comment(capsys, "--body", str(leaky), "--pr", str(PR))[0] == 0
    [posted] = gh_env.bodies(REPO, PR)
    assert TOKEN not in posted and "GITHUB_TOKEN=***" in posted


def test_endless_pages_and_a_dripping_server_are_exit_5_in_seconds(
    gh_env, body, monkeypatch, capsys
) -> None:
    import time

    from traceml_ci.github.client import MAX_PAGES

    gh_env.endless_next = "forward"
    code, _, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 5 and f"more than {MAX_PAGES} pages" in err
    assert len(err.strip().splitlines()) == 1 and len(gh_env.requests) == MAX_PAGES

    gh_env.endless_next = None
    gh_env.drip = ("body", 0.3)
    monkeypatch.setattr("traceml_ci.github.client.DEADLINE_S", 1.5)  # read when the client is made
    start = time.monotonic()
    code, _, err = comment(capsys, "--body", str(body), "--pr", str(PR))
    assert code == 5 and "no complete answer before the 1.5 s deadline" in err, err
    assert len(err.strip().splitlines()) == 1 and time.monotonic() - start < 15
