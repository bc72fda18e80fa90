"""``jobq dashboard``: pools, the read-only role, and uvicorn.

Pages read through a pool whose sessions run as ``jobq_reader`` when the
login is a member of it (the usual case: give the dashboard its own login
in jobq_reader). Actions, when allowed, use the login's own rights: retry
and cancel are operator verbs, so that login must be allowed to run them
(the schema owner, or a member of jobq_owner)."""

from __future__ import annotations

import errno
import logging
import socket

import asyncpg
import uvicorn

from jobq import roles
from jobq.dashboard.sessions import allowed_hosts, guarded
from jobq.dashboard.store import is_reader
from jobq.dashboard.web import Dashboard, make_app
from jobq.db import open_pool, translated
from jobq.errors import ConfigError
from jobq.settings import Settings

log = logging.getLogger("jobq.dashboard")


async def _reader_role(url: str, prefix: str) -> str | None:
    with translated():
        conn = await asyncpg.connect(url, timeout=10)
    try:
        member = await is_reader(conn, prefix)
    finally:
        await conn.close()
    return roles.name("reader", prefix) if member else None


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, or ConfigError naming the fix (uvicorn's own
    error was logged after our start line, and exited 3)."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is not a TCP port (1-65535)")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        in_use = exc.errno == errno.EADDRINUSE
        reason = "is in use" if in_use else f"cannot be used ({exc.strerror})"
        raise ConfigError(f"port {port} on {host} {reason}: choose another with --port, or "
                          "--host") from None
    sock.setblocking(False)
    return sock


async def serve(settings: Settings, host: str, port: int, allow_actions: bool,
                refresh_s: int = 5) -> None:
    token = settings.dashboard_token.get_secret_value() if settings.dashboard_token else None
    if allow_actions and not token:
        raise ConfigError("--allow-actions needs JOBQ_DASHBOARD_TOKEN: operators sign in with it")
    if settings.dashboard_signin_to_view and not token:
        raise ConfigError("JOBQ_DASHBOARD_SIGNIN_TO_VIEW needs JOBQ_DASHBOARD_TOKEN: operators "
                          "sign in with it")
    sock = listen(host, port)  # before anything else: a taken port is one clear line
    role = await _reader_role(settings.database_url, settings.role_prefix)
    pooled = settings.database_pooled
    read = await open_pool(settings.database_url, wait=False, app_name="jobq-dashboard",
                           role=role, max_size=4, pooled=pooled)
    act = (await open_pool(settings.database_url, wait=False, app_name="jobq-dashboard-actions",
                           max_size=2, pooled=pooled)) if allow_actions else None
    try:
        app = guarded(make_app(Dashboard(
            read, act, token, refresh_s=max(0, refresh_s),
            signin_to_view=settings.dashboard_signin_to_view,
            secure_cookie=settings.dashboard_secure_cookie)),
            allowed_hosts(host, settings.dashboard_hosts))
        log.info("dashboard on http://%s:%d/ (%s%s)", host, port,
                 f"pages as {role}" if role else "pages as the login (not in jobq_reader)",
                 ", actions on" if allow_actions else ", read-only")
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                               access_log=False, lifespan="off"))
        await server.serve(sockets=[sock])
    finally:
        sock.close()
        await read.close()
        if act is not None:
            await act.close()
