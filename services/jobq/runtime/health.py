"""``/healthz``, ``/readyz`` (for orchestrators) and ``/metrics`` (Prometheus).

- ``/healthz`` (liveness): answered by the service's own event loop, so a
  reply proves the loop is responsive; 503 once a supervised task died.
- ``/readyz`` (readiness): the database answers ``SELECT 1`` within 2 s and
  the broker connection is open; 503 with the failing check otherwise, and
  while draining after SIGTERM.

A tiny HTTP/1.0 responder on asyncio: two fixed paths do not justify a web
framework dependency. It is exposed to whatever can reach the port, so it
bounds what a client can cost: request lines over 8 KiB are refused (400), at
most ``MAX_CONNECTIONS`` are served at once (others are closed at once), a
client gets 5 s to send its line, and readiness is computed at most once a
second (``READY_CACHE_S``) however often it is asked.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("jobq.runtime.health")

# Named checks (True = fine); a str value explains a failure ("problem").
Check = Callable[[], Awaitable[dict[str, bool | str]]]

MAX_CONNECTIONS = 32
MAX_LINE = 8192
READY_CACHE_S = 1.0


class HealthServer:
    def __init__(self, host: str, port: int, live: Callable[[], bool], ready: Check) -> None:
        self.host, self.port = host, port
        self._live = live
        self._ready = ready
        self._server: asyncio.base_events.Server | None = None
        self._open = 0
        self._ready_cache: tuple[float, dict[str, bool | str]] | None = None

    async def _readiness(self) -> dict[str, bool | str]:
        now = asyncio.get_running_loop().time()
        if self._ready_cache is not None and now - self._ready_cache[0] < READY_CACHE_S:
            return self._ready_cache[1]
        checks: dict[str, bool | str]
        try:
            checks = await asyncio.wait_for(self._ready(), 3)
        except Exception as exc:  # a check that raises is a failed check
            checks = {"error": False}
            log.debug("readiness check failed: %r", exc)
        self._ready_cache = (now, checks)
        return checks

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  limit=MAX_LINE)
        sock = self._server.sockets[0].getsockname()
        self.port = sock[1]
        # DEBUG: a service that stops at once on a mistake prints that one line only
        log.debug("health endpoints on http://%s:%d/healthz and /readyz", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            writer.close()  # over the cap: refused without reading a byte
            return
        self._open += 1
        try:
            await self._handle(reader, writer)
        finally:
            self._open -= 1

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = await asyncio.wait_for(reader.readline(), 5)
            except (ValueError, asyncio.LimitOverrunError):  # a line over MAX_LINE
                writer.write(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else ""
            body: dict[str, object]
            if path == "/healthz":
                ok = self._live()
                status, body = (200, {"status": "ok"}) if ok else (503, {"status": "dead"})
            elif path == "/metrics":
                from jobq.telemetry.metrics import exposition

                payload = exposition()
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                             + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
                await writer.drain()
                return
            elif path == "/readyz":
                checks = await self._readiness()
                ok = all(v is True for v in checks.values())  # a "problem" str fails
                status = 200 if ok else 503
                body = {"ready": ok, **checks}
            else:
                status, body = 404, {"error": "try /healthz, /readyz or /metrics"}
            payload = json.dumps(body).encode()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
