"""One handler child process as its parent sees it (``--pool process``):
the process, its end of the channel, and what the parent tells about it.

A child must not inherit the consumer's secrets: jobq's database and broker
URLs (``JOBQ_*URL*``) carry passwords, and ``PGPASSWORD`` or any
``*PASSWORD*``, ``*TOKEN*``, ``*SECRET*``, ``*KEY*`` variable is someone's
credential. Handlers that need their own connections get their own settings.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from typing import Any

from jobq.worker import frames

# Names that hold a credential (issue #47: PGPASSWORD and *SECRET* reached
# children, the pattern only looked at JOBQ_ names), or a URL that may.
_SECRET = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|KEY|CREDENTIAL|^PGPASSFILE$|^JOBQ_.*URL",
                     re.IGNORECASE)


def child_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _SECRET.search(k)}
    # The child imports the app by its spec, so it needs our import path
    # (the working directory, an editable install, a test's package).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class Child:
    __slots__ = ("busy", "jobs", "proc", "reader", "writer")

    def __init__(self, proc: subprocess.Popen[bytes], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.proc = proc
        self.reader = reader
        self.writer = writer
        self.jobs = 0
        self.busy = False  # running a job now (the pool's watch leaves it alone)

    async def send(self, message: list[Any]) -> None:
        await frames.write(self.writer, message)

    def send_nowait(self, message: list[Any]) -> None:
        """Best effort (exit): nothing to wait for if the child is gone."""
        if not self.writer.is_closing():
            self.writer.write(frames.encode(message))


def exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0
