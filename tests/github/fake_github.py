"""A real HTTP server on 127.0.0.1 that answers the few GitHub REST endpoints traceml-ci calls.

GET/POST ``/repos/O/R/issues/N/comments`` (list with ``Link`` pagination, create),
PATCH ``/repos/O/R/issues/comments/ID`` (update), GET ``/repos/O/R/pulls/N`` and GET ``/user``
(403 "Resource not accessible by integration" as for an installation token, unless ``viewer``
names the token's user, as for a personal token). Failures are
scripted with :meth:`FakeGitHub.fail_next`; every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_LIST = re.compile(r"^/repos/([^/]+/[^/]+)/issues/(\d+)/comments$")
_EDIT = re.compile(r"^/repos/([^/]+/[^/]+)/issues/comments/(\d+)$")
_PULL = re.compile(r"^/repos/([^/]+/[^/]+)/pulls/(\d+)$")


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str | None
    body: Any


@dataclass
class Failure:
    method: str
    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    #: True: answer with a text body that echoes the request's headers back; a function: a JSON
    #: error whose message is what it makes of the request's Authorization header.
    echo: bool | Callable[[str], str] = False


class FakeGitHub:
    """State: ``comments[(repo, pr)]`` is a list of dicts; ``heads[(repo, pr)]`` a head sha."""

    def __init__(self, token: str, page_size: int = 100) -> None:
        self.token = token
        self.page_size = page_size
        self.comments: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.heads: dict[tuple[str, int], str] = {}
        self.requests: list[Recorded] = []
        self.failures: list[Failure] = []
        self.next_link_host: str | None = None  # to test an off-host Link header
        #: The token's user for a personal token; None: an installation token (the workflow's
        #: GITHUB_TOKEN), whose comments are github-actions[bot]'s and which cannot GET /user.
        self.viewer: str | None = None
        #: "forward": every list page links a next page, for ever; "same": each links itself
        #: (a broken or hostile proxy).
        self.endless_next: str | None = None
        #: ("head" | "body", seconds): the next answers drip one byte every so many seconds, in
        #: the status line and headers or in the body, as long as the client listens (at most
        #: a minute), defeating a per-read socket timeout.
        self.drip: tuple[str, float] | None = None
        self._ids = 1000
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), daemon=True
        )

    # -- test-side API -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_pr(self, repo: str, number: int, head_sha: str = "a" * 40) -> None:
        self.comments.setdefault((repo, number), [])
        self.heads[(repo, number)] = head_sha

    def add_comment(self, repo: str, number: int, body: str, user: str = "someone") -> int:
        with self._lock:
            self._ids += 1
            self.comments[(repo, number)].append(self._comment(repo, self._ids, body, user))
            return self._ids

    def fail_next(
        self,
        method: str,
        status: int,
        message: str = "boom",
        headers: dict[str, str] | None = None,
        *,
        echo: bool | Callable[[str], str] = False,
    ) -> None:
        """The next request with ``method`` gets this answer instead (queued, one each).

        ``echo``: the body is one line of plain text echoing the request line and the
        Authorization header (raw and percent-encoded), as some proxies and debug servers do; a
        function of the header: a JSON error whose message is what it returns (a hostile server
        echoing the token in an encoding of its choice)."""
        self.failures.append(Failure(method, status, message, dict(headers or {}), echo))

    def bodies(self, repo: str, number: int) -> list[str]:
        return [c["body"] for c in self.comments.get((repo, number), [])]

    def start(self) -> FakeGitHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- server side -------------------------------------------------------------------------

    def _comment(self, repo: str, cid: int, body: str, user: str) -> dict[str, Any]:
        return {
            "id": cid,
            "body": body,
            "user": {"login": user, "type": "Bot" if user.endswith("[bot]") else "User"},
            "html_url": f"https://github.example/{repo}/pull/1#issuecomment-{cid}",
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                fake._dispatch(self, "GET")

            def do_POST(self) -> None:
                fake._dispatch(self, "POST")

            def do_PATCH(self) -> None:
                fake._dispatch(self, "PATCH")

        return Handler

    def _dispatch(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urllib.parse.urlsplit(h.path)
        query = urllib.parse.parse_qs(parts.query)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        with self._lock:
            auth = h.headers["Authorization"]
            self.requests.append(Recorded(method, parts.path, query, auth, body))
            failure = next((f for f in self.failures if f.method == method), None)
            if failure:
                self.failures.remove(failure)
        if self.drip is not None:
            return self._drip(h, *self.drip)
        if failure and callable(failure.echo):
            said = failure.echo(h.headers.get("Authorization") or "")
            return self._send(h, failure.status, {"message": said}, failure.headers)
        if failure and failure.echo:
            auth = h.headers.get("Authorization") or ""
            text = f"{failure.message}: {h.requestline} Authorization: {auth} "
            text += f"auth={urllib.parse.quote(auth, safe='')}\n"
            return self._send_raw(h, failure.status, text.encode(), "text/plain")
        if failure:
            return self._send(h, failure.status, {"message": failure.message}, failure.headers)
        if h.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(h, 401, {"message": "Bad credentials"})
        if parts.path == "/user" and method == "GET":
            if self.viewer is None:
                return self._send(h, 403, {"message": "Resource not accessible by integration"})
            return self._send(h, 200, {"login": self.viewer, "type": "User"})
        if m := _LIST.match(parts.path):
            key = (m.group(1), int(m.group(2)))
            if key not in self.comments:
                return self._send(h, 404, {"message": "Not Found"})
            if method == "GET":
                return self._list(h, key, query)
            if method == "POST":
                with self._lock:
                    self._ids += 1
                    author = self.viewer or "github-actions[bot]"
                    item = self._comment(key[0], self._ids, body["body"], author)
                    self.comments[key].append(item)
                return self._send(h, 201, item)
        if (m := _EDIT.match(parts.path)) and method == "PATCH":
            cid = int(m.group(2))
            for (repo, _), items in self.comments.items():
                for item in items:
                    if repo == m.group(1) and item["id"] == cid:
                        item["body"] = body["body"]
                        return self._send(h, 200, item)
            return self._send(h, 404, {"message": "Not Found"})
        if (m := _PULL.match(parts.path)) and method == "GET":
            key = (m.group(1), int(m.group(2)))
            if key not in self.heads:
                return self._send(h, 404, {"message": "Not Found"})
            return self._send(h, 200, {"number": key[1], "head": {"sha": self.heads[key]}})
        return self._send(h, 404, {"message": "Not Found"})

    def _drip(self, h: BaseHTTPRequestHandler, where: str, every_s: float) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n"
        try:
            if where == "body":
                h.wfile.write(head + b"\r\n[")
                head = b" " * 4096
            deadline = time.monotonic() + 60
            for byte in head:
                if time.monotonic() > deadline:
                    break
                h.wfile.write(bytes([byte]))
                h.wfile.flush()
                time.sleep(every_s)
        except OSError:
            pass  # the client hung up: what the test wants
        h.close_connection = True

    def _list(self, h: BaseHTTPRequestHandler, key: tuple[str, int], query: dict) -> None:
        per_page = min(int(query.get("per_page", ["30"])[0]), self.page_size)
        page = int(query.get("page", ["1"])[0])
        items = self.comments[key]
        chunk = items[(page - 1) * per_page : page * per_page]
        headers = {}
        if self.endless_next:
            step = 1 if self.endless_next == "forward" else 0
            nxt = f"{self.url}/repos/{key[0]}/issues/{key[1]}/comments?page={page + step}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        elif page * per_page < len(items):
            host = self.next_link_host or self.url
            path = f"/repos/{key[0]}/issues/{key[1]}/comments"
            nxt = f"{host}{path}?per_page={per_page}&page={page + 1}"
            last = (len(items) + per_page - 1) // per_page
            headers["Link"] = (
                f'<{nxt}>; rel="next", '
                f'<{self.url}/repos/{key[0]}/issues/{key[1]}/comments?page={last}>; rel="last"'
            )
        self._send(h, 200, chunk, headers)

    def _send(
        self, h: BaseHTTPRequestHandler, status: int, data: Any, headers: dict | None = None
    ) -> None:
        self._send_raw(h, status, json.dumps(data).encode(), "application/json", headers)

    def _send_raw(
        self,
        h: BaseHTTPRequestHandler,
        status: int,
        raw: bytes,
        content_type: str,
        headers: dict | None = None,
    ) -> None:
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(raw)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(raw)
