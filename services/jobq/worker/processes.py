"""``--pool process``: sync handlers run in a pre-started pool of child
processes (as Celery's prefork pool and BullMQ's sandboxed processors).

The parent keeps claims, acks, leases and heartbeats; a child only runs a
handler (``child.py``). What this buys over threads:

- a child's death (SIGKILL, OOM kill, segfault, ``os._exit``) is known at
  once and attributed exactly to the job it ran (:class:`ChildDied`); every
  other job of the consumer keeps running, and the child is replaced;
- lease lost, timeout and shutdown *stop* the handler: SIGTERM, then SIGKILL
  after ``kill_grace_s`` (a thread cannot be stopped);
- CPU-bound handlers use every core (threads share one GIL);
- ``max_jobs_per_child`` / ``max_memory_mb`` recycle children that leak.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from typing import Any

from jobq.backoff import Backoff
from jobq.errors import ConfigError, Fail, Retry
from jobq.worker import frames
from jobq.worker.run import Run

log = logging.getLogger("jobq.consumer")

START_TIMEOUT_S = 60.0
# Settings a handler's process must not inherit: the consumer's credentials
# (database and broker URLs carry passwords) and tokens. Handlers that need
# their own connections get their own settings.
_SECRET = re.compile(r"^JOBQ_.*(URL|PASSWORD|TOKEN|SECRET|KEY)", re.IGNORECASE)


def child_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _SECRET.match(k)}
    # The child imports the app by its spec, so it needs our import path
    # (the working directory, an editable install, a test's package).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class ChildDied(Exception):
    """The child process running a job died before answering."""


class HandlerError(Exception):
    """A handler's exception, as the child described it."""


class _Child:
    __slots__ = ("jobs", "proc", "reader", "writer")

    def __init__(self, proc: subprocess.Popen[bytes], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.proc = proc
        self.reader = reader
        self.writer = writer
        self.jobs = 0

    async def send(self, message: list[Any]) -> None:
        await frames.write(self.writer, message)

    def send_nowait(self, message: list[Any]) -> None:
        """Best effort (exit): nothing to wait for if the child is gone."""
        if not self.writer.is_closing():
            self.writer.write(frames.encode(message))


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class ProcessPool:
    def __init__(self, app_spec: str, size: int, *, max_jobs_per_child: int | None = None,
                 max_memory_mb: float | None = None, kill_grace_s: float = 2.0) -> None:
        self.app_spec = app_spec
        self.size = size
        self.max_jobs = max_jobs_per_child
        self.max_memory_mb = max_memory_mb
        self.kill_grace_s = kill_grace_s
        self._idle: asyncio.Queue[_Child] = asyncio.Queue()
        self._children: set[_Child] = set()
        self._side: set[asyncio.Task[None]] = set()
        self._closing = False

    async def start(self) -> None:
        for child in await asyncio.gather(*(self._spawn() for _ in range(self.size))):
            self._idle.put_nowait(child)
        log.info("process pool ready: %d children", self.size)

    async def _spawn(self) -> _Child:
        mine, theirs = socket.socketpair()
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobq.worker.child", self.app_spec, str(theirs.fileno()),
             str(os.getpid())],
            pass_fds=(theirs.fileno(),), env=child_environment(), stdin=subprocess.DEVNULL)
        theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=mine)
        child = _Child(proc, reader, writer)
        self._children.add(child)
        try:
            msg = await asyncio.wait_for(frames.read(child.reader), START_TIMEOUT_S)
        except (EOFError, OSError, TimeoutError, frames.FrameError) as exc:
            await self._reap(child)
            raise ConfigError(f"a handler child process did not start ({exc!r}, "
                              f"{_exit_text(proc.poll())})") from exc
        if msg[0] == "fatal":
            await self._reap(child)
            raise ConfigError(f"a handler child process cannot load {self.app_spec}: {msg[1]}")
        return child

    async def _reap(self, child: _Child) -> int | None:
        """Forget a child that died or was told to go; make sure it is gone."""
        self._children.discard(child)
        child.writer.close()  # whoever waits for its next message sees it gone
        for _ in range(200):
            if child.proc.poll() is not None:
                break
            await asyncio.sleep(0.01)
        if child.proc.poll() is None:
            child.proc.kill()
            await asyncio.sleep(0.05)
        return child.proc.poll()

    def _stop(self, child: _Child) -> None:
        """SIGTERM now, SIGKILL after the grace if it is still there."""
        if child.proc.poll() is not None:
            return
        child.proc.terminate()
        asyncio.get_running_loop().call_later(
            self.kill_grace_s, self._kill_if_alive, child)

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    @staticmethod
    def _kill_if_alive(child: _Child) -> None:
        if child.proc.poll() is None:
            child.proc.kill()

    def _replace(self) -> None:
        if not self._closing:
            self._background(self._respawn())

    async def _respawn(self) -> None:
        backoff = Backoff(0.1, 5.0)
        while not self._closing:
            try:
                self._idle.put_nowait(await self._spawn())
                return
            except Exception as exc:
                log.warning("cannot start a handler child process (%s); retrying", exc)
                await backoff.sleep()

    async def call(self, run: Run, job_fields: dict[str, Any]) -> Any:
        """Run the job's handler in a child; raises its error, or ChildDied."""
        child = await self._idle.get()
        run.kill_child = lambda: self._stop(child)
        try:
            await child.send(["run", run.job.queue, job_fields, run.max_result_bytes])
            msg = await frames.read(child.reader)
        except (EOFError, OSError, frames.FrameError) as exc:
            code = await self._reap(child)
            self._replace()
            raise ChildDied(f"its handler's child process {child.proc.pid} died "
                            f"({_exit_text(code)})") from exc
        except asyncio.CancelledError:
            self._stop(child)  # never leave a handler running unowned
            self._background(self._reap(child))
            self._replace()
            raise
        finally:
            run.kill_child = None
        child.jobs += 1
        self._recycle_or_keep(child)
        if msg[0] == "ok":  # the result as JSON text, checked against the limit
            return json.loads(msg[1]) if msg[1] is not None else None
        _, kind, text, delay_s = msg
        if kind == "retry":
            raise Retry(text, delay_s=delay_s)
        if kind == "fail":
            raise Fail(text)
        raise HandlerError(text)

    def _recycle_or_keep(self, child: _Child) -> None:
        why = None
        if self.max_jobs is not None and child.jobs >= self.max_jobs:
            why = f"ran {child.jobs} jobs (--max-jobs-per-child)"
        elif self.max_memory_mb is not None:
            rss = _rss_mb(child.proc.pid)
            if rss > self.max_memory_mb:
                why = f"uses {rss:.0f} MB (--max-memory-per-child {self.max_memory_mb:.0f})"
        if why is None:
            self._idle.put_nowait(child)
            return
        log.info("recycling handler child process %d: %s", child.proc.pid, why)
        try:
            child.send_nowait(["exit"])
        except OSError:
            pass
        self._background(self._reap(child))
        self._replace()

    async def close(self) -> None:
        self._closing = True
        for child in list(self._children):
            try:
                child.send_nowait(["exit"])
            except OSError:
                pass
            self._stop(child)
        await asyncio.gather(*(self._reap(c) for c in list(self._children)), *self._side,
                             return_exceptions=True)
