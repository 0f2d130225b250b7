"""A minimal GitHub REST client (standard library only) to list, create and edit PR comments.

It retries once on a 5xx answer and once on a secondary rate limit, follows ``Link: rel="next"``
pagination (only on the API's own host, at most ``MAX_PAGES`` pages), gives up past its time
(``REQUEST_TIMEOUT_S`` a request, however slowly the answer drips; ``DEADLINE_S`` all of a
command's work), never follows redirects (urllib would carry the token
to wherever they point) and never puts the token into an error message: the token is stripped of
surrounding whitespace (a secret pasted with its line break), refused without being quoted if
anything else in it is not visible ASCII, and every error the client raises passes through
:func:`redact`, which masks it in every form a server could echo it in (raw, JSON- or
percent-encoded, base64). A rate limit's header that is not a time (``Retry-After: NaN``) is an
API error, never a wait.
"""

from __future__ import annotations

import base64
import functools
import http.client
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from traceml_ci._version import __version__
from traceml_ci.errors import ApiError, UsageError

DEFAULT_API_URL = "https://api.github.com"
API_VERSION = "2022-11-28"
PER_PAGE = 100
#: Who writes a comment made with an installation token of GitHub Actions (the GITHUB_TOKEN).
ACTIONS_BOT_LOGIN = "github-actions[bot]"
#: Seconds to wait before the one retry after a 5xx answer (GitHub sends no retry-after then).
SERVER_ERROR_BACKOFF_S = 2.0
#: Without a retry-after header, GitHub says to wait at least a minute after a secondary limit.
SECONDARY_LIMIT_BACKOFF_S = 60.0
#: Never sleep longer than this on a retry-after header, whatever it says.
MAX_BACKOFF_S = 120.0
#: Seconds a socket may stay silent (connect, or between two reads).
TIMEOUT_S = 30.0
#: Seconds one request may take in all, headers and body: a server that drips its answer a byte
#: at a time never trips the socket timeout, but it trips this.
REQUEST_TIMEOUT_S = 60.0
#: Seconds all of one command's API work may take, retries and their waits included.
DEADLINE_S = 300.0
#: Pages of a listing followed at most (5,000 comments at PER_PAGE); a next link past them is an
#: error, never an endless walk.
MAX_PAGES = 50

#: What a token may hold: visible ASCII (GitHub's tokens are letters, digits and ``_``).
_TOKEN = re.compile(r"[\x21-\x7e]+")
#: Where a malformed secret would be cut into pieces that could each be echoed on their own.
_TOKEN_BREAKS = re.compile(r"[\s\x00-\x1f\x7f]+")
#: Forms shorter than this are not redacted (they would mangle ordinary words).
_MIN_SECRET = 6
REDACTED = "***"

_NEXT_LINK = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
PERMISSION_HINT = (
    "the job needs `permissions: pull-requests: write` (a pull request from a fork gets a "
    "read-only token: post from a workflow_run job instead, see github-action/README.md)"
)


def normalise_token(token: str) -> str:
    """``token`` without surrounding whitespace; a UsageError that never quotes it if it is blank
    or anything inside it (a line break, a space, a control or non-ASCII character) cannot be
    part of a token, which an HTTP header would otherwise carry or echo."""
    core = token.strip()
    if not core:
        raise UsageError("GITHUB_TOKEN is blank: pass a token with pull-requests: write")
    if not _TOKEN.fullmatch(core):
        raise UsageError(
            "GITHUB_TOKEN has a line break, space, control or non-ASCII character inside it "
            "(not printed): set the secret to the token alone"
        )
    return core


def _pieces(secret: str) -> set[str]:
    """``secret`` as is, stripped, and cut at its line breaks: the parts that could each be
    echoed on their own."""
    return {secret, secret.strip(), *_TOKEN_BREAKS.split(secret)}


def _secret_forms(secret: str) -> set[str]:
    """The fixed strings ``secret`` can come back as: each piece escaped as Python prints it,
    and base64-encoded at each of the three offsets it can start at inside a longer encoded
    text (``Basic base64(user:token)``, ``base64(Bearer token)``), standard and URL-safe: the
    characters that only the piece's own bytes decide."""
    forms: set[str] = set()
    for piece in _pieces(secret):
        raw = piece.encode("utf-8", "replace")
        forms |= {piece, ascii(piece)[1:-1], repr(raw)[2:-1], json.dumps(piece)[1:-1]}
        for offset in range(3):
            encoded = base64.b64encode(bytes(offset) + raw).decode("ascii")
            first, end = -(-8 * offset // 6), 8 * (offset + len(raw)) // 6
            core = encoded[first:end]
            forms |= {core, core.replace("+", "-").replace("/", "_")}
    return {f for f in forms if len(f) >= _MIN_SECRET}


#: JSON's short escapes of a character (and the form-encoding of a space).
_SHORT_ESCAPES = {'"': [r'\\"'], "\\": [r"\\\\"], "/": [r"\\/"], " ": [r"\+"],
                  "\n": [r"\\n"], "\r": [r"\\r"], "\t": [r"\\t"]}


def _char_pattern(c: str) -> str:
    """A regex for one character of a secret in any escape a server or proxy may echo it in:
    as is, percent-encoded (every byte, once or twice), a JSON or JavaScript ``\\u`` escape, a
    Python ``\\x`` escape, an HTML character reference, JSON's short escapes."""
    code = ord(c)
    forms = [re.escape(c), "".join(f"%(?:25)?{b:02x}" for b in c.encode("utf-8", "replace")),
             f"&#x0*{code:x};", f"&#0*{code};", *_SHORT_ESCAPES.get(c, [])]
    if code < 0x10000:
        forms.append(rf"\\u{code:04x}")
    if code < 0x100:
        forms.append(rf"\\x{code:02x}")
    return "(?:" + "|".join(forms) + ")"


@functools.lru_cache(maxsize=8)
def _secret_pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex for every piece of ``secrets``, each character in any of its escapes (mixed as
    a server likes: ``ghs%5F...``); case-insensitive, for the hex digits. None: nothing to mask."""
    pieces = {p for s in secrets for p in _pieces(s) if len(p) >= _MIN_SECRET}
    if not pieces:
        return None
    alternatives = ("".join(map(_char_pattern, p)) for p in sorted(pieces, key=len, reverse=True))
    return re.compile("|".join(alternatives), re.IGNORECASE)


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every form of each secret replaced by ``***``: the fixed forms of
    :func:`_secret_forms` (Python's escapes, base64), then any mix of per-character escapes
    (:func:`_secret_pattern`: raw, percent-encoded, JSON-escaped). The one redaction: every
    error the client raises and every body it posts goes through it."""
    given = tuple(s for s in secrets if s)
    forms: set[str] = set()
    for secret in given:
        forms |= _secret_forms(secret)
    for form in sorted(forms, key=len, reverse=True):  # the longest first: "a\\n" before "a"
        text = text.replace(form, REDACTED)
    pattern = _secret_pattern(given)
    return text if pattern is None else pattern.sub(REDACTED, text)


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    data: Any


@dataclass(frozen=True)
class IssueComment:
    id: int
    body: str
    user: str | None = None
    html_url: str | None = None
    user_type: str | None = None  # "Bot" for app tokens (the workflow's GITHUB_TOKEN)

    def written_by(self, login: str) -> bool:
        """Whether ``login`` wrote this comment (GitHub logins ignore case)."""
        return self.user is not None and self.user.casefold() == login.casefold()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IssueComment:
        user = data.get("user") or {}
        if not isinstance(data.get("id"), int):
            raise ApiError("GitHub API: a comment in the answer has no numeric id")
        return cls(
            id=int(data["id"]),
            body=str(data.get("body") or ""),
            user=user.get("login") if isinstance(user, dict) else None,
            html_url=data.get("html_url"),
            user_type=user.get("type") if isinstance(user, dict) else None,
        )


class CreateUncertain(ApiError):
    """A create answered 5xx: the comment may or may not exist now."""


class TimedOut(ApiError):
    """A request, or the command's API work as a whole, ran past its time."""


class _Watch:
    """Shuts a request's socket when its time is up, whatever the server is sending."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(seconds, 0.0), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def attach(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            if self.expired:
                self._shut()

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            try:  # the plain socket's shutdown, also under TLS: the reader sees end of stream
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
            except OSError:
                pass


def _watched(base: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
    class Watched(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, watch: _Watch, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._watch = watch

        def connect(self) -> None:
            super().connect()
            self._watch.attach(self.sock)

    return Watched


_HTTPConnection = _watched(http.client.HTTPConnection)
_HTTPSConnection = _watched(http.client.HTTPSConnection)


class _WatchedHTTP(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self._watch = watch

    def http_open(self, req):  # type: ignore[no-untyped-def]
        return self.do_open(functools.partial(_HTTPConnection, watch=self._watch), req)


class _WatchedHTTPS(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self._watch = watch

    def https_open(self, req):  # type: ignore[no-untyped-def]
        conn = functools.partial(_HTTPSConnection, watch=self._watch)
        return self.do_open(conn, req, context=self._context)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None  # the 3xx surfaces as an HTTPError, handled like any other status


@dataclass
class GitHubClient:
    """Talks to one GitHub (or GitHub Enterprise) API with one token.

    ``sleep`` is injectable so tests need not wait for real back-offs. The limits default to
    the module's ``TIMEOUT_S``, ``REQUEST_TIMEOUT_S`` and ``DEADLINE_S`` when the client is made;
    the deadline counts from then: one client per command.
    """

    token: str = field(repr=False)
    api_url: str = DEFAULT_API_URL
    sleep: Callable[[float], None] = field(default=lambda s: time.sleep(s), repr=False)
    timeout_s: float | None = None
    request_timeout_s: float | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        self._secrets = (self.token,)  # as given: redacted in every form, even before the check
        self.token = normalise_token(self.token)
        self._secrets = (self.token, *self._secrets)
        self._author: str | None = None
        self.timeout_s = TIMEOUT_S if self.timeout_s is None else self.timeout_s
        if self.request_timeout_s is None:
            self.request_timeout_s = REQUEST_TIMEOUT_S
        self.deadline_s = DEADLINE_S if self.deadline_s is None else self.deadline_s
        self._ends = time.monotonic() + self.deadline_s
        self.api_url = self.api_url.rstrip("/")
        self._origin = _origin(self.api_url)

    # -- endpoints ---------------------------------------------------------------------------

    def author_login(self) -> str:
        """The login the comments this client writes carry: the one a comment it created in this
        process carries, else the token's user (``GET /user``, personal tokens), else
        ``github-actions[bot]``: an installation token (the workflow's GITHUB_TOKEN) may not ask
        ``GET /user`` (403) and writes as the Actions app's bot."""
        if self._author is None:
            try:
                data = self._request("GET", self._url("/user"), what="asking who the token is").data
                login = data.get("login") if isinstance(data, dict) else None
            except TimedOut:
                raise
            except ApiError:
                login = None
            self._author = login if isinstance(login, str) and login else ACTIONS_BOT_LOGIN
        return self._author

    def iter_issue_comments(self, repo: str, number: int) -> Iterator[IssueComment]:
        """Every comment on issue or pull request ``number``, oldest first, page by page."""
        url: str | None = self._url(f"/repos/{repo}/issues/{number}/comments?per_page={PER_PAGE}")
        what = f"listing the comments of {repo}#{number}"
        seen: set[str] = set()
        while url:
            if len(seen) == MAX_PAGES:
                self._fail(
                    f"GitHub API: {what}: more than {MAX_PAGES} pages ({MAX_PAGES * PER_PAGE:,} "
                    "comments) or a next link without end; stopped"
                )
            seen.add(url)
            resp = self._request("GET", url, what=what)
            if not isinstance(resp.data, list):
                got = type(resp.data).__name__
                self._fail(f"GitHub API: {what}: expected a list, got {got}")
            for item in resp.data:
                yield IssueComment.from_json(item)
            url = self._next_page(resp.headers.get("link"), what)
            if url in seen:
                self._fail(f"GitHub API: {what}: the next link links back to a page already read")

    def create_issue_comment(self, repo: str, number: int, body: str) -> IssueComment:
        what = f"creating a comment on {repo}#{number}"
        resp = self._request(
            "POST", self._url(f"/repos/{repo}/issues/{number}/comments"), {"body": body}, what
        )
        made = IssueComment.from_json(resp.data)
        if made.user:
            self._author = made.user  # who we are, as GitHub says it, whatever GET /user said
        return made

    def update_issue_comment(self, repo: str, comment_id: int, body: str) -> IssueComment:
        what = f"updating comment {comment_id} in {repo}"
        resp = self._request(
            "PATCH", self._url(f"/repos/{repo}/issues/comments/{comment_id}"), {"body": body}, what
        )
        return IssueComment.from_json(resp.data)

    def pull_request_head_sha(self, repo: str, number: int) -> str:
        what = f"reading pull request {repo}#{number}"
        resp = self._request("GET", self._url(f"/repos/{repo}/pulls/{number}"), what=what)
        try:
            return str(resp.data["head"]["sha"])
        except (KeyError, TypeError):
            self._fail(f"GitHub API: {what}: the answer has no head.sha")

    # -- transport ---------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return self.api_url + path

    def _next_page(self, link: str | None, what: str) -> str | None:
        if not link:
            return None
        match = _NEXT_LINK.search(link)
        if not match:
            return None
        url = match.group(1)
        if _origin(url) != self._origin:
            # Following it would send the token to another host.
            self._fail(f"GitHub API: {what}: the next page points off {self._origin}; not followed")
        return url

    def _request(
        self, method: str, url: str, payload: Any = None, what: str = "calling the GitHub API"
    ) -> Response:
        retried = False
        while True:
            status, headers, raw, reason = self._send(method, url, payload, what)
            if 200 <= status < 300:
                try:
                    return Response(status, headers, json.loads(raw.decode()) if raw else None)
                except (UnicodeDecodeError, ValueError):
                    self._fail(f"GitHub API: {what}: the answer is not JSON")
            # Redacted before it is cut short: a cut could leave a piece of the token behind.
            message = _error_message(self.scrub(raw.decode("utf-8", "replace"))) or reason
            try:
                wait = None if retried else _retry_wait(status, headers, message)
            except ValueError as exc:  # a rate limit's Retry-After that is not a time
                said = _describe(status, headers, message, what, retried)
                self._fail(f"{said}; not retried: {exc}")
            if wait is not None and method == "POST" and status >= 500:
                # GitHub can create the comment and still answer 5xx: a blind retry could post
                # it twice. The caller looks for it before trying again.
                self._fail(_describe(status, headers, message, what, retried), CreateUncertain)
            if wait is None:
                self._fail(_describe(status, headers, message, what, retried))
            if wait >= self._left():
                self._fail(
                    f"GitHub API: {what}: a retry would wait {wait:g} s, past the "
                    f"{self.deadline_s:g} s deadline for this command's GitHub API work "
                    f"({_describe(status, headers, message, what, retried)})",
                    TimedOut,
                )
            retried = True
            self.sleep(wait)

    def _send(
        self, method: str, url: str, payload: Any, what: str
    ) -> tuple[int, dict[str, str], bytes, str]:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        try:
            req = urllib.request.Request(url, data=data, method=method)
        except ValueError as exc:  # e.g. a GITHUB_API_URL without a scheme
            self._fail(f"GitHub API: {what}: bad API URL: {exc}")
        req.add_header("Accept", "application/vnd.github+json")
        req.add_header("X-GitHub-Api-Version", API_VERSION)
        req.add_header("User-Agent", f"traceml-ci/{__version__}")
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        left = self._left()
        if left <= 0:
            self._fail(
                f"GitHub API: {what}: the {self.deadline_s:g} s deadline for this command's "
                "GitHub API work has passed; stopped",
                TimedOut,
            )
        limit = min(self.request_timeout_s, left)  # type: ignore[type-var]
        watch = _Watch(limit)
        opener = urllib.request.build_opener(_NoRedirect, _WatchedHTTP(watch), _WatchedHTTPS(watch))
        try:
            try:
                with opener.open(req, timeout=min(self.timeout_s, limit)) as resp:  # type: ignore[type-var]
                    answer = resp.status, _lower(resp.headers), resp.read(), resp.reason or ""
            except urllib.error.HTTPError as exc:
                try:
                    raw = exc.read()
                except (OSError, http.client.HTTPException):
                    raw = b""
                answer = exc.code, _lower(exc.headers), raw, str(exc.reason or "")
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
            # ValueError: a GITHUB_API_URL without a scheme; HTTPException: a broken answer.
            if watch.expired:
                self._timed_out(what, limit)
            reason = getattr(exc, "reason", exc)
            self._fail(f"GitHub API: {what}: cannot reach {self._origin}: {reason}")
        finally:
            watch.cancel()
        if watch.expired:  # an answer read until the connection closed: cut short
            self._timed_out(what, limit)
        return answer

    def _left(self) -> float:
        """Seconds left of the command's deadline."""
        return self._ends - time.monotonic()

    def _timed_out(self, what: str, limit: float) -> NoReturn:
        if limit < self.request_timeout_s:  # type: ignore[operator]
            self._fail(
                f"GitHub API: {what}: no complete answer before the {self.deadline_s:g} s "
                "deadline for this command's GitHub API work; stopped",
                TimedOut,
            )
        self._fail(
            f"GitHub API: {what}: no complete answer within {limit:g} s (a stalled or dripping "
            "connection); stopped",
            TimedOut,
        )

    def _fail(self, message: str, kind: type[ApiError] = ApiError) -> NoReturn:
        """Raise ``kind`` with ``message`` redacted: the one way the client reports an error."""
        raise kind(self.scrub(message)) from None

    def scrub(self, text: str) -> str:
        """``text`` with the token, in any form it could be echoed in, replaced by ``***``."""
        return redact(text, *self._secrets)


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()} if headers is not None else {}


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip().splitlines()[0][:200] if text.strip() else ""
    if isinstance(data, dict):
        return str(data.get("message") or "")
    return ""


def _is_secondary_limit(status: int, headers: Mapping[str, str], message: str) -> bool:
    if status not in (403, 429):
        return False
    return "retry-after" in headers or "secondary rate limit" in message.lower()


def _retry_wait(status: int, headers: Mapping[str, str], message: str) -> float | None:
    """Seconds to wait before the one retry, or None when this answer is final. Raises
    ValueError for a Retry-After that is not a time (never slept on)."""
    if status >= 500:
        return SERVER_ERROR_BACKOFF_S
    if _is_secondary_limit(status, headers, message):
        given = headers.get("retry-after")
        wait = SECONDARY_LIMIT_BACKOFF_S if given is None else retry_after_s(given)
        return min(wait, MAX_BACKOFF_S)
    return None


def retry_after_s(value: str, now: Callable[[], float] = time.time) -> float:
    """A ``Retry-After`` header's seconds (RFC 9110: whole seconds, or an HTTP date, a past
    one meaning now); ValueError for anything else (``NaN``, ``-5``, ``1e400``, words)."""
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(text)  # however many digits: at most inf, which the cap takes
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        raise ValueError(f"Retry-After {value[:40]!r} is neither seconds nor a date") from None
    return max(when - now(), 0.0)


def _reset_time(reset: str) -> str:
    """`` until HH:MM:SS UTC`` for an ``X-RateLimit-Reset`` (epoch seconds); nothing when it is
    not a time a clock can show (far in the future, not a number)."""
    if not (reset.isascii() and reset.isdigit()) or len(reset) > 12:
        return ""
    try:
        return f" until {time.strftime('%H:%M:%S UTC', time.gmtime(int(reset)))}"
    except (OverflowError, ValueError, OSError):
        return ""


def _describe(status: int, headers: Mapping[str, str], message: str, what: str,
              retried: bool = False) -> str:
    detail = f"{status} {message}".strip()
    if status == 401:
        return (
            f"GitHub API: {what}: the token was rejected ({detail}); pass a valid token in "
            "GITHUB_TOKEN (the Action's github-token input)"
        )
    if status in (403, 429) and headers.get("x-ratelimit-remaining") == "0":
        when = _reset_time(headers.get("x-ratelimit-reset", ""))
        return f"GitHub API: {what}: rate limit exhausted{when} ({detail})"
    if _is_secondary_limit(status, headers, message):
        again = "still rate-limited after one retry" if retried else "rate-limited"
        return f"GitHub API: {what}: {again} ({detail})"
    if status == 403:
        return f"GitHub API: {what}: permission denied ({detail}); {PERMISSION_HINT}"
    if status == 404:
        return (
            f"GitHub API: {what}: not found ({detail}); check the repository and pull request "
            "number, and that the token can see the repository"
        )
    if 300 <= status < 400:
        where = headers.get("location", "?")
        return (
            f"GitHub API: {what}: redirected ({status}) to {where}; not followed "
            "(a renamed repository?)"
        )
    return f"GitHub API: {what}: failed ({detail})"
