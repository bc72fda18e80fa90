"""`make run` stops as a user expects (issue #33): Ctrl-C (SIGINT to the
terminal's process group) drains and stops the reaper, both consumers and
the demo producer, and says so only once they all exited; if the parent
(make) is SIGKILLed, the script notices and stops everything too. Found by
the processes' environment: nothing may be left with the run's namespace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.helpers import SyncDB, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
# A stand-in for make: survives Ctrl-C itself, runs the script as make does.
PARENT = ("import signal, subprocess, sys; signal.signal(signal.SIGINT, lambda *a: None); "
          "sys.exit(subprocess.call(['bash', 'deploy/run-local.sh']))")


def _ours(namespace: str) -> list[int]:
    """Pids whose environment names this run's namespace."""
    marker = f"JOBQ_NAMESPACE={namespace}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(int(pid))
        except OSError:
            pass
    return found


def _start(env: dict[str, str], tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "run-local.log"
    bin_dir = os.path.dirname(sys.executable)
    run_env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               "JOBQ_DEMO_RATE": "20"}
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, env=run_env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until(lambda: b"jobq running" in log.read_bytes(), 60, "run-local's banner")
    return proc, log


def test_ctrl_c_stops_everything_and_says_so(env: dict[str, str], db: SyncDB,
                                             tmp_path: Path) -> None:
    proc, log = _start(env, tmp_path)
    try:
        wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'")
                   >= 10, 60, "the demo's jobs running")
        assert len(_ours(env["JOBQ_NAMESPACE"])) >= 5
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        assert proc.wait(60) == 0
        left = _ours(env["JOBQ_NAMESPACE"])
        text = log.read_text()
        assert left == [], text[-3000:]
        assert "run-local: stopped" in text
        assert "Traceback" not in text and "restarting" not in text, text[-3000:]
    finally:
        for pid in _ours(env["JOBQ_NAMESPACE"]):
            os.kill(pid, signal.SIGKILL)


def test_a_killed_parent_takes_everything_with_it(env: dict[str, str],
                                                  tmp_path: Path) -> None:
    proc, log = _start(env, tmp_path)
    try:
        os.kill(proc.pid, signal.SIGKILL)  # `kill -9` of make's pid
        proc.wait(10)
        deadline = time.monotonic() + 30
        while _ours(env["JOBQ_NAMESPACE"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _ours(env["JOBQ_NAMESPACE"]) == [], log.read_text()[-3000:]
    finally:
        for pid in _ours(env["JOBQ_NAMESPACE"]):
            os.kill(pid, signal.SIGKILL)
