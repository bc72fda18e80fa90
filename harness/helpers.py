"""Test helpers: a synchronous database handle, condition waits with a
deadline, and a factory for real jobq processes that are killed at teardown."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

T = TypeVar("T")


def wait_until(cond: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class SyncDB:
    """asyncpg behind a private event loop, for tests that drive processes.
    Reconnects (and retries once) when the server went away, so a test can
    keep asserting across a PostgreSQL restart."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.loop = asyncio.new_event_loop()
        self.conn: asyncpg.Connection = self.loop.run_until_complete(asyncpg.connect(url))

    def _run(self, method: str, sql: str, *args: Any) -> Any:
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.conn.is_closed():
                    self.conn = self.loop.run_until_complete(asyncpg.connect(self.url))
                return self.loop.run_until_complete(getattr(self.conn, method)(sql, *args))
            except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                    asyncpg.InternalClientError,  # e.g. no host is read-write yet (failover)
                    asyncpg.exceptions.CannotConnectNowError,
                    asyncpg.exceptions.AdminShutdownError):
                if time.monotonic() > deadline:
                    raise
                if not self.conn.is_closed():
                    self.conn.terminate()
                time.sleep(0.2)

    def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        return self._run("fetch", sql, *args)  # type: ignore[no-any-return]

    def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record:
        """The one row the statement returns (an AssertionError if none)."""
        row: asyncpg.Record | None = self._run("fetchrow", sql, *args)
        assert row is not None, f"no row: {sql[:80]}"
        return row

    def val(self, sql: str, *args: Any) -> Any:
        return self._run("fetchval", sql, *args)

    def execute(self, sql: str, *args: Any) -> str:
        return self._run("execute", sql, *args)  # type: ignore[no-any-return]

    def close(self) -> None:
        if not self.conn.is_closed():
            self.loop.run_until_complete(self.conn.close())
        self.loop.close()


class Proc:
    def __init__(self, name: str, args: list[str], env: dict[str, str], logdir: Path,
                 raw: bool = False, wrap: Callable[[list[str]], list[str]] | None = None,
                 ) -> None:
        """Runs ``python -m jobq ARGS`` (or ``python ARGS`` with ``raw``);
        ``wrap`` rewrites the command line (e.g. to run in a network
        namespace: harness/netns.py; it must exec, keeping the pid)."""
        self.name = name
        self.log_path = logdir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        argv = [sys.executable, *args] if raw else [sys.executable, "-m", "jobq", *args]
        argv = wrap(argv) if wrap else argv
        self.popen = subprocess.Popen(
            argv, env=env, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float = 15) -> re.Match[str]:
        """The first match of ``pattern`` in the log; on a timeout, or once the
        process exited without it, an AssertionError with the log as it is
        then (read at the end: the start's log is empty) and the exit code."""
        rx = re.compile(pattern)

        def seen() -> re.Match[str] | bool | None:
            return rx.search(self.log()) or self.popen.poll() is not None

        found = None
        try:
            found = wait_until(seen, timeout, f"{self.name} to log {pattern!r}")
        except AssertionError as exc:
            why = str(exc)
        if isinstance(found, re.Match):
            return found
        if found is not None:
            why = f"{self.name} exited with {self.popen.returncode} before logging {pattern!r}"
        raise AssertionError(f"{why}; log:\n{self.log()[-3000:]}")

    def worker_id(self) -> str:
        return self.wait_log(r"consumer ready worker=(\S+)").group(1)

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def close(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.popen.kill()
            self.popen.wait(10)
        self._log.close()


# Which login a jobq command runs as in the tests (issue #14): each service
# as its own least-privileged role, as a deployment runs it. The env fixture
# passes one URL per role (JOBQ_TEST_LOGIN_<ROLE>); commands not listed here
# (migrate, queue set, cancel, retry, prune) are operators' and run as the
# schema owner. A test that sets JOBQ_DATABASE_URL itself keeps its own.
_ROLE_OF = {"consume": "CONSUMER", "reap": "REAPER", "publish": "PRODUCER",
            "stats": "READER", "inspect": "READER", "queue list": "READER", "keys": "READER",
            "queue limits": "READER"}


def as_role(env: dict[str, str], args: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``env`` with the database and broker URLs of the role of command ``args``."""
    args = list(args)
    verb = " ".join(args[:2]) if args[:1] == ["queue"] else " ".join(args[:1])
    # `queue limits` shows; `queue limits --auto-create off` changes (an operator's);
    # `keys` shows, `keys set` changes
    changes = (verb == "queue limits" and len(args) > 2) or args[:2] == ["keys", "set"]
    role = None if changes else _ROLE_OF.get(verb)
    out = dict(env)
    for kind, key in (("LOGIN", "JOBQ_DATABASE_URL"), ("BROKER", "JOBQ_AMQP_URL")):
        admin_url = env.get(f"JOBQ_TEST_{kind}_ADMIN")
        if role and admin_url and env.get(key) == admin_url and f"JOBQ_TEST_{kind}_{role}" in env:
            out[key] = env[f"JOBQ_TEST_{kind}_{role}"]
    return out


class Procs:
    """Factory fixture: start jobq processes; all are killed at teardown."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.procs: list[Proc] = []
        self._n = 0

    def start(self, *args: str, name: str | None = None,
              wrap: Callable[[list[str]], list[str]] | None = None,
              environ: Mapping[str, str] | None = None, **env: str) -> Proc:
        """``environ`` and ``env``: variables on top of the test's (a mapping
        passed as ``**`` could bind ``name`` or ``wrap``: mypy refuses it)."""
        self._n += 1
        proc = Proc(name or f"{args[0]}{self._n}", list(args),
                    as_role({**self.env, **(environ or {}), **env}, args), self.logdir,
                    wrap=wrap)
        self.procs.append(proc)
        return proc

    def consumer(self, *extra: str, wrap: Callable[[list[str]], list[str]] | None = None,
                 environ: Mapping[str, str] | None = None, **env: str) -> Proc:
        return self.start("consume", "harness.apps:app", *extra, wrap=wrap,
                          environ={**(environ or {}), **env})

    def reaper(self, environ: Mapping[str, str] | None = None, **env: str) -> Proc:
        return self.start("reap", environ={**(environ or {}), **env})

    def close(self) -> None:
        for p in self.procs:
            p.close()


def run_cli(env: dict[str, str], *args: str, timeout: float = 30,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobq", *args], env=as_role(env, args),
                          capture_output=True,
                          text=True, timeout=timeout, input=stdin)


def publish(settings: Any, queue: str, payloads: list[Any]) -> list[Any]:
    """Publish jobs through the Python client; returns their ids."""
    from jobq.newjob import NewJob

    return publish_jobs(settings, [NewJob(queue, p) for p in payloads])


def publish_jobs(settings: Any, jobs: list[Any]) -> list[Any]:
    """Publish NewJobs (with their options) through the Python client; their ids."""
    from jobq.client.producer import Client

    async def go() -> list[Any]:
        async with Client(settings) as client:
            return await client.publish_many(jobs)

    return asyncio.run(go())


def set_queue(db: SyncDB, name: str, **settings: float | str) -> None:
    """Create or change a queue's settings with plain SQL, as a user would."""
    db.execute("INSERT INTO jobq.queue (name) VALUES ($1) ON CONFLICT DO NOTHING", name)
    for column, value in settings.items():
        db.execute(f"UPDATE jobq.queue SET {column} = $2 WHERE name = $1", name, value)


def runs(db: SyncDB, job_id: Any) -> list[Any]:
    return db.fetch("SELECT * FROM test_run WHERE job_id = $1 ORDER BY n", job_id)


def job(db: SyncDB, job_id: Any) -> Any:
    return db.fetchrow("SELECT * FROM jobq.job WHERE id = $1", job_id)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TcpProxy:
    """127.0.0.1:<port> forwarded to a real service; ``cut()`` drops the
    listener and every open connection (as a network partition or a restarted
    server would), ``restore()`` listens again on the same port."""

    def __init__(self, target_host: str, target_port: int) -> None:
        import threading

        self.target = (target_host, target_port)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port,
                                                  reuse_address=True)

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self._call(self._start())

    def cut(self) -> None:
        self._call(self._cut())

    def url(self, real_url: str) -> str:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(real_url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        netloc_ = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
        return urlunsplit(parts._replace(netloc=netloc_))

    def close(self) -> None:
        self._call(self._cut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


# e2e leases are short so the suite stays fast; detection must land within
# lease + slack (I3).
LEASE_S = 1.0
SLACK_S = 1.0


def completed(db: SyncDB, ids: list[Any]) -> bool:
    return bool(db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) "
                       "AND status = 'completed'", ids) == len(ids))


def requeue_latency(db: SyncDB, job_id: Any, since: float, timeout: float) -> float:
    """Seconds from ``since`` (a kill, time.monotonic()) until the reaper
    requeued (or failed) the job: its stall count went up."""
    before = db.val("SELECT stalls FROM jobq.job WHERE id = $1", job_id)
    wait_until(lambda: db.val("SELECT stalls FROM jobq.job WHERE id = $1", job_id) > before,
               timeout, f"job {job_id} to be requeued", interval=0.01)
    return time.monotonic() - since


def lost_and_duplicates(db: SyncDB, ids: list[Any]) -> tuple[int, int]:
    """(jobs not completed, handler runs beyond one per job)."""
    lost = db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND status <> 'completed'",
                  ids)
    runs_ = db.val("SELECT count(*) FROM test_run WHERE job_id = ANY($1)", ids)
    return int(lost), int(runs_) - len(ids)


def with_pool(db_url: str, body: Callable[[asyncpg.Pool], Any]) -> Any:
    """Run ``await body(pool)`` on a fresh pool (in-process lease-layer tests)."""
    async def go() -> Any:
        pool = await asyncpg.create_pool(db_url, min_size=1, max_size=4)
        try:
            return await body(pool)
        finally:
            await pool.close()

    return asyncio.run(go())


def http(url: str, timeout: float = 3, data: bytes | None = None) -> tuple[int, bytes]:
    """One request's status and body; the response is closed on every path.
    An unclosed response (an HTTPError left to the garbage collector
    included) keeps its socket open, and pytest turns the ResourceWarning
    that follows into a failure of whichever test happens to be running."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, data=data, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def wait_http(url: str, timeout: float, what: str) -> None:
    """Until ``url`` answers (any status but a refused connection)."""

    def up() -> bool:
        try:
            http(url, timeout=2)
            return True
        except OSError:
            return False

    wait_until(up, timeout, what)
