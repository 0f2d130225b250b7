"""GitHubClient against the fake server: pagination, retries, refusals, what errors say."""

from __future__ import annotations

import pytest

from tests.github.conftest import PR, REPO, TOKEN
from tests.github.fake_github import FakeGitHub
from traceml_ci.errors import ApiError
from traceml_ci.github.client import GitHubClient


@pytest.fixture
def slept() -> list[float]:
    return []


@pytest.fixture
def client(github: FakeGitHub, slept: list[float]) -> GitHubClient:
    return GitHubClient(token=TOKEN, api_url=github.url + "/", sleep=slept.append)


def test_lists_every_page_in_order(github: FakeGitHub, client: GitHubClient) -> None:
    github.page_size = 3
    ids = [github.add_comment(REPO, PR, f"c{i}") for i in range(8)]
    assert [c.id for c in client.iter_issue_comments(REPO, PR)] == ids
    assert len(github.requests) == 3


def test_listing_stops_when_the_caller_does(github: FakeGitHub, client: GitHubClient) -> None:
    github.page_size = 2
    for i in range(6):
        github.add_comment(REPO, PR, f"c{i}")
    assert next(iter(client.iter_issue_comments(REPO, PR))).body == "c0"
    assert len(github.requests) == 1


def test_create_and_update(github: FakeGitHub, client: GitHubClient) -> None:
    made = client.create_issue_comment(REPO, PR, "hello")
    assert made.user == "github-actions[bot]" and made.html_url
    edited = client.update_issue_comment(REPO, made.id, "bye")
    assert (edited.id, edited.body) == (made.id, "bye")
    assert github.requests[-1].body == {"body": "bye"}


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_errors_are_retried_once(github, client, slept, status) -> None:
    github.fail_next("GET", status)
    assert list(client.iter_issue_comments(REPO, PR)) == []
    assert slept == [2.0]


def test_a_create_that_got_a_5xx_is_not_blindly_retried(github, client, slept) -> None:
    from traceml_ci.github.client import CreateUncertain

    github.fail_next("POST", 502)
    with pytest.raises(CreateUncertain):
        client.create_issue_comment(REPO, PR, "x")
    assert github.bodies(REPO, PR) == []


def test_upsert_after_a_5xx_create_looks_again_and_still_makes_one_comment(
    github, client, slept
) -> None:
    from traceml_ci.github.sticky import upsert_comment

    github.fail_next("POST", 500)
    marker = "<!-- traceml-ci:report job=t -->"
    upsert_comment(client, REPO, PR, f"{marker}\nreport", marker)
    assert len(github.bodies(REPO, PR)) == 1


@pytest.mark.parametrize(
    ("status", "message", "headers", "wait"),
    [
        (403, "You have exceeded a secondary rate limit.", {}, 60.0),
        (403, "slow down", {"Retry-After": "7"}, 7.0),
        (429, "Too Many Requests", {"Retry-After": "9999"}, 120.0),  # capped
    ],
)
def test_secondary_rate_limits_are_retried_once(
    github, client, slept, status, message, headers, wait
) -> None:
    github.fail_next("GET", status, message, headers)
    assert list(client.iter_issue_comments(REPO, PR)) == []
    assert slept == [wait]


def test_a_second_rate_limit_is_an_error(github, client, slept) -> None:
    for _ in range(2):
        github.fail_next("GET", 429, "Too Many Requests", {"Retry-After": "1"})
    with pytest.raises(ApiError, match="still rate-limited after one retry"):
        list(client.iter_issue_comments(REPO, PR))


def test_primary_rate_limit_is_not_retried(github, client, slept) -> None:
    github.fail_next("GET", 403, "API rate limit exceeded",
                     {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "0"})  # fmt: skip
    with pytest.raises(ApiError, match="rate limit exhausted until 00:00:00 UTC"):
        list(client.iter_issue_comments(REPO, PR))
    assert slept == []


def test_errors_say_what_failed(github: FakeGitHub, client: GitHubClient) -> None:
    with pytest.raises(ApiError, match=r"octo/nope#3: not found \(404 Not Found\)"):
        list(client.iter_issue_comments("octo/nope", 3))
    github.fail_next("PATCH", 422, "Validation Failed")
    with pytest.raises(ApiError, match=r"updating comment 5 in octo/widgets: failed \(422"):
        client.update_issue_comment(REPO, 5, "x")


def test_redirects_are_not_followed(github: FakeGitHub, client: GitHubClient) -> None:
    github.fail_next("GET", 301, "Moved Permanently", {"Location": "https://elsewhere.example/"})
    with pytest.raises(ApiError, match="redirected .301. to https://elsewhere.example/"):
        list(client.iter_issue_comments(REPO, PR))
    assert len(github.requests) == 1


def test_next_page_off_the_api_host_is_refused(github: FakeGitHub, client: GitHubClient) -> None:
    github.page_size = 1
    github.add_comment(REPO, PR, "a")
    github.add_comment(REPO, PR, "b")
    github.next_link_host = "http://attacker.example"
    with pytest.raises(ApiError, match="next page points off"):
        list(client.iter_issue_comments(REPO, PR))


def test_unreachable_api(slept: list[float]) -> None:
    client = GitHubClient(token=TOKEN, api_url="http://127.0.0.1:9", sleep=slept.append)
    with pytest.raises(ApiError, match="cannot reach http://127.0.0.1:9") as exc:
        client.create_issue_comment(REPO, PR, "x")
    assert TOKEN not in str(exc.value)


def test_token_is_not_in_repr_nor_in_echoed_errors(github: FakeGitHub, client) -> None:
    assert TOKEN not in repr(client)
    github.fail_next("POST", 400, f"bad header Bearer {TOKEN}")
    with pytest.raises(ApiError) as exc:
        client.create_issue_comment(REPO, PR, "x")
    assert TOKEN not in str(exc.value) and "Bearer ***" in str(exc.value)


def test_a_marker_pasted_by_someone_else_is_neither_edited_nor_trusted(
    github, client, slept
) -> None:
    from traceml_ci.github.sticky import Outcome, upsert_comment

    marker = "<!-- traceml-ci:report job=t -->"
    theirs = github.add_comment(REPO, PR, f"{marker}\nfake pass", user="mallory")
    first = upsert_comment(client, REPO, PR, f"{marker}\nreport 1", marker)
    assert first.outcome is Outcome.CREATED
    second = upsert_comment(client, REPO, PR, f"{marker}\nreport 2", marker)
    assert second.outcome is Outcome.UPDATED and second.comment.id == first.comment.id
    bodies = github.bodies(REPO, PR)
    assert f"{marker}\nfake pass" in bodies and f"{marker}\nreport 2" in bodies
    assert len(bodies) == 2 and theirs != first.comment.id


@pytest.mark.parametrize(
    "echo",
    [
        "Bearer {t}",
        "b'Bearer {t}\\n'",
        '{{"authorization": "Bearer {t}"}}',
        "auth=Bearer%20{q}",
        "auth=Bearer+{p}",
    ],
)
def test_redact_removes_every_form_a_token_is_echoed_in(echo: str) -> None:
    import urllib.parse

    from traceml_ci.github.client import redact

    token = 'gh p/"x\\y+z=ok'  # characters that each escaping changes
    text = echo.format(
        t=token, q=urllib.parse.quote(token, safe=""), p=urllib.parse.quote_plus(token, safe="")
    )
    for form in (text, ascii(text), repr(text.encode())):
        cleaned = redact(form, token)
        assert "***" in cleaned and "x\\y" not in cleaned and "ok" not in cleaned.split("***")[-1]


def test_an_error_answer_cut_short_leaves_no_piece_of_the_token(github, client) -> None:
    github.fail_next("GET", 400, "x" * 92, echo=True)  # the cut at 200 falls inside the token
    with pytest.raises(ApiError) as exc:
        list(client.iter_issue_comments(REPO, PR))
    assert TOKEN[:8] not in str(exc.value)


@pytest.mark.parametrize("bad", ["", "  \n", "a\nb", "tok\x1ben", "t\u00f6ken"])
def test_an_unusable_token_is_refused_without_quoting_it(bad: str) -> None:
    from traceml_ci.errors import ExitCode, UsageError

    with pytest.raises(UsageError) as exc:
        GitHubClient(token=bad, api_url="http://127.0.0.1:9")
    assert exc.value.exit_code is ExitCode.BAD_INPUT
    assert "GITHUB_TOKEN" in str(exc.value) and (not bad.strip() or bad not in str(exc.value))


MARK = "<!-- traceml-ci:report job=t -->"


def test_another_bots_comment_starting_with_the_marker_is_left_alone(github, client) -> None:
    from traceml_ci.github.sticky import Outcome, upsert_comment

    theirs = github.add_comment(REPO, PR, f"{MARK}\ncopied by another app", user="mirror[bot]")
    first = upsert_comment(client, REPO, PR, f"{MARK}\nreport 1", MARK)
    assert first.outcome is Outcome.CREATED and first.comment.id != theirs
    second = upsert_comment(client, REPO, PR, f"{MARK}\nreport 2", MARK)
    assert second.outcome is Outcome.UPDATED and second.comment.id == first.comment.id
    assert github.bodies(REPO, PR) == [f"{MARK}\ncopied by another app", f"{MARK}\nreport 2"]


def test_our_bots_comment_quoting_the_marker_later_in_the_body_is_not_ours(github, client) -> None:
    from traceml_ci.github.sticky import Outcome, upsert_comment

    for quoted in (f"> {MARK}\n> quoted", f"  {MARK}\nindented", f"see below\n{MARK}\nx"):
        github.add_comment(REPO, PR, quoted, user="github-actions[bot]")
    assert upsert_comment(client, REPO, PR, f"{MARK}\nr", MARK).outcome is Outcome.CREATED
    assert len(github.bodies(REPO, PR)) == 4


def test_with_a_personal_token_only_the_tokens_users_comment_is_ours(github, client) -> None:
    from traceml_ci.github.sticky import Outcome, upsert_comment

    github.viewer = "octocat"
    bots = github.add_comment(REPO, PR, f"{MARK}\nthe workflow's", user="github-actions[bot]")
    other = github.add_comment(REPO, PR, f"{MARK}\nsomeone's", user="hubot")
    made = upsert_comment(client, REPO, PR, f"{MARK}\nmine", MARK)
    assert made.outcome is Outcome.CREATED and made.comment.id not in (bots, other)
    assert made.comment.user == "octocat"
    again = upsert_comment(client, REPO, PR, f"{MARK}\nmine 2", MARK)
    assert again.outcome is Outcome.UPDATED and again.comment.id == made.comment.id
    assert sum(r.path == "/user" for r in github.requests) == 1  # asked once per client


def test_an_installation_token_owns_github_actions_bots_comment(github, client) -> None:
    from traceml_ci.github.sticky import Outcome, upsert_comment

    ours = github.add_comment(REPO, PR, f"{MARK}\nold", user="github-actions[bot]")
    result = upsert_comment(client, REPO, PR, f"{MARK}\nnew", MARK)
    assert result.outcome is Outcome.UPDATED and result.comment.id == ours


def test_endless_next_links_stop_at_the_page_cap(github, client) -> None:
    from traceml_ci.github.client import MAX_PAGES

    github.endless_next = "forward"
    with pytest.raises(ApiError, match=f"more than {MAX_PAGES} pages") as exc:
        list(client.iter_issue_comments(REPO, PR))
    assert len(github.requests) == MAX_PAGES
    assert "\n" not in str(exc.value)


def test_a_next_link_back_to_a_page_already_read_is_refused(github, client) -> None:
    github.endless_next = "same"
    with pytest.raises(ApiError, match="links back to a page already read"):
        list(client.iter_issue_comments(REPO, PR))
    assert len(github.requests) == 2  # ?per_page=100, then ?page=1 twice: refused


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_dripping_answer_is_cut_off_at_the_request_deadline(github, slept, where) -> None:
    import time

    github.drip = (where, 0.3)  # a byte every 0.3 s: never idle for the 1 s socket timeout
    client = GitHubClient(
        token=TOKEN, api_url=github.url, sleep=slept.append, timeout_s=1.0, request_timeout_s=1.5
    )
    start = time.monotonic()
    with pytest.raises(ApiError, match=r"no complete answer within 1\.5 s") as exc:
        list(client.iter_issue_comments(REPO, PR))
    assert time.monotonic() - start < 15  # 1.5 s and the load of a busy machine
    assert "\n" not in str(exc.value) and slept == []


def test_no_retry_sleeps_past_the_commands_deadline(github, slept) -> None:
    import time

    client = GitHubClient(token=TOKEN, api_url=github.url, sleep=slept.append, deadline_s=5)
    github.fail_next("GET", 403, "slow down", {"Retry-After": "30"})  # would sleep past it
    start = time.monotonic()
    with pytest.raises(ApiError, match=r"a retry would wait 30 s, past the 5 s deadline"):
        list(client.iter_issue_comments(REPO, PR))
    assert slept == [] and time.monotonic() - start < 10


def test_the_whole_commands_api_work_has_one_deadline(github, slept) -> None:
    import time

    client = GitHubClient(
        token=TOKEN, api_url=github.url, sleep=slept.append, timeout_s=1.0, deadline_s=2.0
    )
    list(client.iter_issue_comments(REPO, PR))  # fine while there is time
    github.drip = ("body", 0.3)
    start = time.monotonic()
    with pytest.raises(ApiError, match=r"no complete answer before the 2 s deadline"):
        client.create_issue_comment(REPO, PR, "x")
    assert time.monotonic() - start < 15
    github.drip = None
    time.sleep(max(0.0, 2.1 - (time.monotonic() - start)))
    with pytest.raises(ApiError, match=r"the 2 s deadline for this command's GitHub API work "):
        client.update_issue_comment(REPO, 1, "y")


def _every_byte_percent(text: str) -> str:
    return "".join(f"%{b:02X}" for b in text.encode())


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


def _json_u_escapes(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


#: How a hostile or careless server may echo the Authorization header (``Bearer <token>``) back:
#: name -> (the echo, what the message must not hold afterwards).
ECHOES = {
    "raw": lambda auth: f"bad header {auth}",
    "percent-encoded, unreserved _ too": lambda auth: "auth=" + auth.replace("_", "%5F"),
    "percent-encoded, lower-case hex": lambda auth: "auth=" + auth.replace("_", "%5f"),
    "percent-encoded, every byte": lambda auth: "auth=" + _every_byte_percent(auth),
    "percent-encoded twice": lambda auth: "auth=" + _every_byte_percent(auth).replace("%", "%25"),
    "JSON \\u escapes": lambda auth: "auth=" + _json_u_escapes(auth),
    "base64 of the header": lambda auth: "auth=" + _b64(auth),
    "base64 of the token": lambda auth: "token=" + _b64(auth.removeprefix("Bearer ")),
    "base64 of a basic credential": lambda auth: "basic=" + _b64(
        "x-access-token:" + auth.removeprefix("Bearer ")),
    "url-safe base64": lambda auth: "t=" + _b64(auth).replace("+", "-").replace("/", "_"),
}


@pytest.mark.parametrize("form", list(ECHOES))
def test_a_token_echoed_in_any_encoding_is_masked(github, client, form) -> None:
    """A server echoing the token back in an error body, in whichever encoding it likes: the
    error we print has no form of it (percent-encoding `_` printed ``ghs%5F...`` before)."""
    echo = ECHOES[form]
    github.fail_next("POST", 400, echo=echo)
    with pytest.raises(ApiError) as exc:
        client.create_issue_comment(REPO, PR, "x")
    message = str(exc.value)
    echoed = echo(f"Bearer {TOKEN}").split("=", 1)[-1].removeprefix("bad header ")
    assert "***" in message, message
    assert echoed not in message and TOKEN not in message, message
    # nothing long enough to be a piece of it is left: at most a few characters at the edges
    inner = echoed[len(echoed) // 4: -len(echoed) // 4]
    assert inner not in message, message


@pytest.mark.parametrize("value", ["NaN", "nan", "inf", "-5", "1e400", "soon", "3.5e9999"])
def test_a_nonsense_retry_after_is_an_api_error_never_a_sleep(github, client, slept, value):
    """``Retry-After: NaN`` reached time.sleep(nan), a ValueError: exit 4. A Retry-After that
    is neither whole seconds nor an HTTP date is an API error (exit 5), with no wait."""
    github.fail_next("GET", 403, "You have exceeded a secondary rate limit.",
                     {"Retry-After": value})
    with pytest.raises(ApiError, match="Retry-After") as exc:
        list(client.iter_issue_comments(REPO, PR))
    assert exc.value.exit_code == 5 and slept == []
    assert len(github.requests) == 1
    assert "after one retry" not in str(exc.value)  # one request, none retried


def test_a_retry_after_as_an_http_date_waits_until_then(github, client, slept) -> None:
    from email.utils import formatdate

    github.fail_next("GET", 429, "Too Many Requests",
                     {"Retry-After": formatdate(__import__("time").time() + 30, usegmt=True)})
    assert list(client.iter_issue_comments(REPO, PR)) == []
    assert len(slept) == 1 and 25 <= slept[0] <= 31


@pytest.mark.parametrize("reset", ["99999999999999999999", "9" * 400, "253402300800"])
def test_a_rate_limit_reset_far_in_the_future_is_an_api_error(github, client, slept, reset):
    """``X-RateLimit-Reset`` past what a clock can show (time.gmtime's OverflowError /
    ValueError, exit 4): the rate-limit error all the same, the time left out."""
    github.fail_next("GET", 403, "API rate limit exceeded",
                     {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset})
    with pytest.raises(ApiError, match="rate limit exhausted") as exc:
        list(client.iter_issue_comments(REPO, PR))
    assert exc.value.exit_code == 5 and slept == []
