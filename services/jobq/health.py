"""``/healthz``, ``/readyz`` (for orchestrators) and ``/metrics`` (Prometheus).

- ``/healthz`` (liveness): answered by the service's own event loop, so a
  reply proves the loop is responsive; 503 once a supervised task died.
- ``/readyz`` (readiness): the database answers ``SELECT 1`` within 2 s and
  the broker connection is open; 503 with the failing check otherwise, and
  while draining after SIGTERM.

A tiny HTTP/1.0 responder on asyncio: two fixed paths do not justify a web
framework dependency.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("jobq.health")

Check = Callable[[], Awaitable[dict[str, bool]]]


class HealthServer:
    def __init__(self, host: str, port: int, live: Callable[[], bool], ready: Check) -> None:
        self.host, self.port = host, port
        self._live = live
        self._ready = ready
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sock = self._server.sockets[0].getsockname()
        self.port = sock[1]
        log.info("health endpoints on http://%s:%d/healthz and /readyz", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else ""
            body: dict[str, object]
            if path == "/healthz":
                ok = self._live()
                status, body = (200, {"status": "ok"}) if ok else (503, {"status": "dead"})
            elif path == "/metrics":
                from jobq.metrics import exposition

                payload = exposition()
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                             + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
                await writer.drain()
                return
            elif path == "/readyz":
                try:
                    checks = await asyncio.wait_for(self._ready(), 3)
                except Exception as exc:  # a check that raises is a failed check
                    checks = {"error": False}
                    log.debug("readiness check failed: %r", exc)
                ok = all(checks.values())
                status = 200 if ok else 503
                body = {"ready": ok, **checks}
            else:
                status, body = 404, {"error": "try /healthz, /readyz or /metrics"}
            payload = json.dumps(body).encode()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
