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
import functools
import json
import logging
import os
import socket
import subprocess
import sys
from typing import Any

from jobq.errors import ConfigError, Fail, RateLimited, Retry, SignalInvalid, Snooze
from jobq.runtime.backoff import Backoff
from jobq.worker import frames
from jobq.worker.child_process import Child, child_environment, exit_text, rss_mb
from jobq.worker.run import Run

log = logging.getLogger("jobq.consumer")

START_TIMEOUT_S = 60.0
START_TRIES = 3  # children that may die before taking one job before it is failed (retried)
WATCH_S = 1.0  # how often idle children are checked for life


class ChildDied(Exception):
    """The child process running a job died before answering."""


class HandlerError(Exception):
    """A handler's exception, as the child described it."""


class ProcessPool:
    def __init__(self, app_spec: str, size: int, *, max_jobs_per_child: int | None = None,
                 max_memory_mb: float | None = None, kill_grace_s: float = 2.0) -> None:
        self.app_spec = app_spec
        self.size = size
        self.max_jobs = max_jobs_per_child
        self.max_memory_mb = max_memory_mb
        self.kill_grace_s = kill_grace_s
        self._idle: asyncio.Queue[Child] = asyncio.Queue()
        self._children: set[Child] = set()
        self._side: set[asyncio.Task[None]] = set()
        self._closing = False

    async def start(self) -> None:
        for child in await asyncio.gather(*(self._spawn() for _ in range(self.size))):
            self._idle.put_nowait(child)
        self._background(self._watch())
        log.info("process pool ready: %d children", self.size)

    async def _watch(self) -> None:
        """Replace an idle child that died (killed by hand, OOM-killed while
        idle) within a second, so the pool keeps its size; the job that would
        have gone to it is never charged for it (``call``)."""
        while not self._closing:
            await asyncio.sleep(WATCH_S)
            for child in list(self._children):
                if not child.busy and child.proc.poll() is not None:
                    log.warning("handler child process %d died while idle (%s); replaced",
                                child.proc.pid, exit_text(child.proc.poll()))
                    await self._reap(child)
                    self._replace()

    async def _spawn(self) -> Child:
        mine, theirs = socket.socketpair()
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobq.worker.child", self.app_spec, str(theirs.fileno()),
             str(os.getpid())],
            pass_fds=(theirs.fileno(),), env=child_environment(), stdin=subprocess.DEVNULL)
        theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=mine)
        child = Child(proc, reader, writer)
        self._children.add(child)
        try:
            msg = await asyncio.wait_for(frames.read(child.reader), START_TIMEOUT_S)
        except (EOFError, OSError, TimeoutError, frames.FrameError) as exc:
            await self._reap(child)
            raise ConfigError(f"a handler child process did not start ({exc!r}, "
                              f"{exit_text(proc.poll())})") from exc
        if msg[0] == "fatal":
            await self._reap(child)
            raise ConfigError(f"a handler child process cannot load {self.app_spec}: {msg[1]}")
        return child

    async def _reap(self, child: Child) -> int | None:
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

    def _stop(self, child: Child) -> None:
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
    def _kill_if_alive(child: Child) -> None:
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

    async def _take(self) -> Child:
        """An idle child that is alive (a dead one is replaced, not used)."""
        while True:
            child = await self._idle.get()
            if child not in self._children:
                continue  # the watch reaped it while it waited in line
            if child.proc.poll() is None:
                return child
            await self._reap(child)
            self._replace()

    async def call(self, run: Run, job_fields: dict[str, Any]) -> Any:
        """Run the job's handler in a child; raises its error, or ChildDied
        if the child died after it took the job (``started``). A child that
        dies before is not the job's doing: replaced, and the job goes to
        another (at most ``START_TRIES`` times)."""
        try:
            message = frames.encode(["run", run.job.queue, job_fields, run.max_result_bytes])
        except (TypeError, ValueError, RecursionError, frames.FrameError) as exc:
            raise Fail(f"the job cannot be sent to a handler child process: "
                       f"{type(exc).__name__}: {str(exc)[:200]}") from None
        for _ in range(START_TRIES):
            child = await self._take()
            child.busy = True
            run.kill_child = functools.partial(self._stop, child)
            try:
                if not await self._hand_over(child, run, message):
                    continue  # died before it took the job: another one
                try:
                    msg = await frames.read(child.reader)
                except (EOFError, OSError, frames.FrameError) as exc:
                    code = await self._reap(child)
                    self._replace()
                    raise ChildDied(f"its handler's child process {child.proc.pid} died "
                                    f"({exit_text(code)})") from exc
            except asyncio.CancelledError:
                self._stop(child)  # never leave a handler running unowned
                self._background(self._reap(child))
                self._replace()
                raise
            finally:
                run.kill_child = None
            child.busy = False
            child.jobs += 1
            self._recycle_or_keep(child)
            return _answer(msg)
        raise HandlerError(f"{START_TRIES} handler child processes died before taking the job "
                           "(see the consumer's log); it runs again later")

    async def _hand_over(self, child: Child, run: Run, message: bytes) -> bool:
        """Send the job and wait for ``started``: False if the child died
        before it took it (it is replaced); ChildDied if it broke the channel
        or the run was stopped meanwhile."""
        try:
            child.writer.write(message)
            await child.writer.drain()
            started = await frames.read(child.reader)
        except (EOFError, OSError, frames.FrameError):
            if run.stop_reason is not None:  # we stopped it: the run reads why
                raise ChildDied("stopped before it started") from None
            log.warning("handler child process %d died before it took job %s (%s); replaced, "
                        "the job goes to another", child.proc.pid, run.job.id,
                        exit_text(await self._reap(child)))
            self._replace()
            return False
        if started != ["started"]:
            self._stop(child)
            self._background(self._reap(child))
            self._replace()
            raise ChildDied(f"its handler's child process {child.proc.pid} broke the protocol "
                            f"(sent {str(started)[:40]} for started)")
        return True

    def _recycle_or_keep(self, child: Child) -> None:
        why = None
        if self.max_jobs is not None and child.jobs >= self.max_jobs:
            why = f"ran {child.jobs} jobs (--max-jobs-per-child)"
        elif self.max_memory_mb is not None:
            rss = rss_mb(child.proc.pid)
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


def _answer(msg: list[Any]) -> Any:
    """The child's answer as the handler's return value or its exception."""
    if msg[0] == "ok":  # the result as JSON text, checked against the limit
        return json.loads(msg[1]) if msg[1] is not None else None
    _, kind, text, delay_s, tb = msg
    exc: Exception = (Retry(text, delay_s=delay_s) if kind == "retry" else
                      Fail(text) if kind == "fail" else
                      Snooze(delay_s, text) if kind == "snooze" else
                      RateLimited(delay_s, text) if kind == "rate_limited" else
                      SignalInvalid(text) if kind == "invalid" else HandlerError(text))
    exc.remote_traceback = tb  # type: ignore[attr-defined]  # the child's frames
    if kind.startswith("refused:"):  # the handler's fail_on / retry_on (child.py)
        exc.jobq_refused = kind.split(":", 1)[1]  # type: ignore[attr-defined]
    raise exc
