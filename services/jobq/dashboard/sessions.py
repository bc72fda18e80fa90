"""Who may look and who may act on the dashboard: sign-in, sessions, CSRF
tokens, and the headers and Host check every response goes through.

- A session is a cookie ``name|issued|mac``: the operator's name, when it was
  issued (Unix seconds), and an HMAC of both under ``JOBQ_DASHBOARD_TOKEN``.
  HttpOnly, SameSite=Strict, Secure when asked; it expires on the server
  after ``SESSION_S`` whatever the browser keeps. Sign-out clears it.
- A CSRF token is an HMAC of the session *and* of what it is for (one job and
  one action, or sign-out), so a token seen on one job's page acts on no
  other job.
- Sign-in attempts take turns and a wrong one costs ``WRONG_TOKEN_DELAY_S``
  before the next, with one log line: about one guess a second per
  dashboard process, instead of ~900.
- Every comparison is of bytes: a non-ASCII token or cookie is simply wrong,
  never a 500.
- The Host header must name this dashboard (DNS rebinding past a loopback
  binding is refused), and every response says ``Cache-Control: no-store``
  and may not be framed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

log = logging.getLogger("jobq.dashboard")

COOKIE = "jobq_dashboard"
SESSION_S = 8 * 3600
WRONG_TOKEN_DELAY_S = 1.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
HEADERS = [
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
       "form-action 'self'; frame-ancestors 'none'")


def _mac(token: str, text: str) -> str:
    return hmac.new(token.encode(), text.encode(), hashlib.sha256).hexdigest()


def same(a: str, b: str) -> bool:
    """Constant-time equality of two texts, any characters."""
    return hmac.compare_digest(a.encode("utf-8", "surrogatepass"),
                               b.encode("utf-8", "surrogatepass"))


class Sessions:
    def __init__(self, token: str | None, secure: bool = False) -> None:
        self.token = token
        self.secure = secure
        self._turns: dict[str, asyncio.Lock] = {}  # per client

    def cookie_for(self, name: str, now: float | None = None) -> str:
        assert self.token
        issued = str(int(time.time() if now is None else now))
        return f"{name}|{issued}|{_mac(self.token, f'session:{name}|{issued}')}"

    def operator(self, cookie: str, now: float | None = None) -> str | None:
        """The signed-in name, or None (no token, forged, expired)."""
        if not self.token or not cookie:
            return None
        rest, _, mac = cookie.rpartition("|")
        name, _, issued = rest.rpartition("|")
        if not name or not issued.isdigit():
            return None
        if not same(mac, _mac(self.token, f"session:{name}|{issued}")):
            return None
        age = (time.time() if now is None else now) - int(issued)
        return name if 0 <= age < SESSION_S else None

    def csrf(self, cookie: str, purpose: str) -> str:
        assert self.token
        return _mac(self.token, f"csrf:{purpose}:{cookie}")

    def csrf_ok(self, cookie: str, purpose: str, given: str) -> bool:
        return bool(self.token) and same(given, self.csrf(cookie, purpose))

    async def sign_in(self, token: str, client: str) -> bool:
        """Whether ``token`` is right. One client's attempts take turns and a
        wrong one waits, so guessing is slow; another client's do not wait
        for them (issue #47: 15 wrong sign-ins at once delayed the real one
        14.7 s, when every attempt took one shared turn)."""
        assert self.token
        if len(self._turns) > 10_000:  # forget idle clients
            self._turns = {c: t for c, t in self._turns.items() if t.locked()}
        turn = self._turns.setdefault(client, asyncio.Lock())
        async with turn:
            if same(token, self.token):
                return True
            log.warning("dashboard sign-in refused (wrong token) from %s", client)
            await asyncio.sleep(WRONG_TOKEN_DELAY_S)
            return False


ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]],
                    Callable[[MutableMapping[str, Any]], Awaitable[None]]], Awaitable[None]]


def guarded(app: ASGIApp, hosts: set[str]) -> ASGIApp:
    """``app`` behind the Host allowlist and with the headers above."""
    async def wrapped(scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                      send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *(h for h in HEADERS if h[0] not in have)]
            await send(message)

        host = dict(scope.get("headers", [])).get(b"host", b"").decode("latin-1")
        if host_name(host) not in hosts:
            body = b"unknown Host: add it to JOBQ_DASHBOARD_HOSTS to serve it\n"
            await with_headers({"type": "http.response.start", "status": 400, "headers": [
                (b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, with_headers)

    return wrapped


def host_name(host: str) -> str:
    """The name of a Host header, without its port ('[::1]:8080' -> '::1')."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def allowed_hosts(bind: str, extra: str) -> set[str]:
    names = {*LOOPBACK, *(h.strip().lower() for h in extra.split(",") if h.strip())}
    if bind not in ("0.0.0.0", "::", ""):
        names.add(host_name(bind))
    return names
