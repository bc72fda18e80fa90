"""Connection strings that name several servers, and failing over between them.

- ``JOBQ_AMQP_URL`` may list broker URLs separated by commas (the nodes of a
  RabbitMQ cluster: ``amqp://u:p@rabbit-1/,amqp://u:p@rabbit-2/``). A
  service connects to the first live one, starting at a random place in the
  list (so a fleet spreads over the nodes) and going on in list order; when
  its node goes away, every reconnection attempt tries the others in the
  same order (:class:`FailoverConnection`). A comma inside a password must
  be percent-encoded (``%2C``).
- ``JOBQ_DATABASE_URL`` may list hosts the libpq way
  (``postgresql://u@db-1:5432,db-2:5432/jobq?target_session_attrs=read-write``);
  asyncpg connects to the first host that is up and, with that parameter, is
  the primary. Here they are only checked and shown without credentials.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import aiormq
from yarl import URL

log = logging.getLogger("jobq.amqp.broker")

RECONNECT_INTERVAL_S = 1.0


def split_amqp(text: str) -> list[str]:
    """The broker URLs of JOBQ_AMQP_URL (one or several, comma-separated)."""
    return [u.strip() for u in text.split(",") if u.strip()]


def with_heartbeat(url: str, heartbeat_s: int) -> str:
    """An AMQP URL with ``heartbeat=`` (unless it sets one already)."""
    parts = urlsplit(url)
    if "heartbeat=" in parts.query:
        return url
    hb = f"heartbeat={heartbeat_s}"
    return urlunsplit(parts._replace(query=f"{parts.query}&{hb}" if parts.query else hb))


def hosts(url: str) -> list[tuple[str, int | None]]:
    """(host, port) of every host a URL names: one, or several separated by
    commas (libpq's multi-host form). Raises ValueError for a bad port."""
    netloc = urlsplit(url).netloc.rpartition("@")[2]
    out: list[tuple[str, int | None]] = []
    for part in netloc.split(","):
        host, port = part, None
        if part.startswith("["):  # [::1]:5432
            host, _, rest = part[1:].partition("]")
            port = _port(rest[1:]) if rest.startswith(":") else None
        elif ":" in part:
            host, _, p = part.rpartition(":")
            port = _port(p)
        out.append((host, port))
    return out


def _port(text: str) -> int | None:
    if text == "":
        return None
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError(f"bad port {text!r} (0-65535)")
    return int(text)


def redact(url: str) -> str:
    """host:port[,host:port…]/path of a URL (or of each of a comma-separated
    list of AMQP URLs), without credentials: for log lines."""
    if url.count("://") > 1:
        return ",".join(redact(u) for u in split_amqp(url))
    try:
        names = ",".join(f"{h or 'localhost'}{f':{p}' if p else ''}" for h, p in hosts(url))
    except ValueError:
        names = "?"
    return f"{names}{urlsplit(url).path}"


class FailoverConnection(aio_pika.RobustConnection):
    """aio-pika's robust connection (it reconnects, reopens channels and
    restores consumers) over several URLs: each connection attempt tries
    every URL once, from the one that last worked on, before it counts as
    failed; aio-pika then waits its reconnect interval and tries again. So the
    first connect fails only if no node is up, and a lost node costs one
    reconnection to another."""

    def __init__(self, urls: Sequence[str], **kwargs: Any) -> None:
        start = random.randrange(len(urls))
        self.urls = [URL(u) for u in [*urls[start:], *urls[:start]]]
        self._at = 0
        if "reconnect_interval" not in self.urls[0].query:
            # aio-pika waits 5 s before each attempt: with another node up,
            # that was the whole cost of a failover (a republished id sat
            # unpublished for it). ?reconnect_interval= in the URL still wins.
            kwargs.setdefault("reconnect_interval", RECONNECT_INTERVAL_S)
        super().__init__(self.urls[0], **kwargs)

    async def _RobustConnection__connect_transport(self) -> None:
        """Called by aio-pika's reconnection loop for every attempt."""
        connect = super()._RobustConnection__connect_transport  # type: ignore[misc]
        again = self.connection_attempt > 0  # a reconnection (the first is not logged)
        last: BaseException | None = None
        refused: BaseException | None = None  # credentials or vhost: say that, not "unreachable"
        for k in range(len(self.urls)):
            i = (self._at + k) % len(self.urls)
            self.url = self.urls[i]
            try:
                await connect()
            except Exception as exc:  # this node: try the next one
                last = exc
                if isinstance(exc, (aiormq.exceptions.ProbableAuthenticationError,
                                    aiormq.exceptions.InvalidFrameError)):
                    refused = refused or exc
                if len(self.urls) > 1:
                    log.warning("broker node %s unreachable (%s: %s); trying the next one",
                                redact(str(self.url)), type(exc).__name__, exc)
                continue
            if again or i != self._at:
                log.info("connected to broker node %s", redact(str(self.url)))
            self._at = i
            return
        assert last is not None
        raise refused or last
