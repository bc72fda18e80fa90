"""One job this process runs: its lease, its handler task, and why it stopped.

A run is *ours* until the first stop reason is recorded; every later path
(renewer, fence, finisher, drain) asks :attr:`Run.ours` instead of reading
several flags, and the first reason wins, so a run never ends twice.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

from jobq.handlers import Handler
from jobq.job import Job
from jobq.lease import Lease


class Stop(str, enum.Enum):
    """Why a run stopped before its handler finished on its own."""

    LOST = "lost"              # the lease is gone: renewal or finish matched no row, or self-fenced
    TIMEOUT = "timeout"        # ran past the queue's timeout_s
    SHUTDOWN = "shutdown"      # SIGTERM past the grace: the lease is released
    HANDED_ON = "handed_on"    # a suspect passed on by a worker isolating another one
    CHILD_DIED = "child_died"  # --pool process: its child process died


class Run:
    __slots__ = ("error", "fence", "handler", "job", "kill_child", "lease", "limited",
                 "max_result_bytes", "payload_text", "stop_reason", "task", "timeout")

    def __init__(self, job: Job, lease_: Lease, handler: Handler) -> None:
        self.job = job
        self.lease = lease_
        self.handler = handler
        self.task: asyncio.Future[Any] | None = None
        self.stop_reason: Stop | None = None
        self.error: BaseException | None = None  # what the handler raised (end hooks)
        self.timeout: asyncio.TimerHandle | None = None
        self.fence: asyncio.TimerHandle | None = None  # owned by the heartbeat
        self.kill_child: Any = None  # set while a child process runs the handler
        self.max_result_bytes = 65536  # the queue's, from the claim
        self.limited = False  # the queue has max_running or rate_per_s
        self.payload_text = "{}"  # the row's payload, for a handler in a child process

    @property
    def ours(self) -> bool:
        """Still ours to finish: not stopped, lease not known lost."""
        return self.stop_reason is None and self.lease.lost is None

    def stop(self, reason: Stop) -> bool:
        """Stop the handler; True if this was the first reason."""
        first = self.stop_reason is None
        if first:
            self.stop_reason = reason
        self.job.stop_requested.set()
        if self.kill_child is not None:
            # A thread cannot be stopped; a child process can. Its death ends
            # the handler's future (ChildDied), read with this stop reason.
            self.kill_child()
        elif self.task is not None and not self.task.done():
            self.task.cancel()
        return first

    def disarm(self) -> None:
        for handle in (self.timeout, self.fence):
            if handle is not None:
                handle.cancel()
        self.timeout = self.fence = None
