"""What an idle fleet costs the database and the broker (issue #37), and how
soon a job published into it starts.

    .venv/bin/python bench/idle_cost.py [--workers 20] [--seconds 60]

For each system in its own scratch database: --workers worker processes,
no jobs, then --seconds of idle measured: PostgreSQL transactions per second
in that database (xact_commit + xact_rollback of pg_stat_database: each
autocommitted statement is one; this server does not load
pg_stat_statements), the CPU its backends used (utime + stime of each
backend of that database, from /proc, at the start and the end of the
window), and RabbitMQ's CPU (the beam.smp process; Celery only uses the
broker). jobq's consumers are measured alone, then with one reaper, whose
sweeps are the fleet's only polling. Then 200 jobs are published one at a
time, 50 ms apart, into the idle jobq fleet, and each handler reports when
it started: publish -> handler start, p50 / p99 / max.

Peers (bench/.venv-peers, as bench/peers.py): pgqueuer 1.6.0 and
procrastinate 3.10.0 workers at their defaults but for a connection pool of 3
(20 of its default 10 are over max_connections), Celery 5.7.0 (solo pool).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import ADMIN_URL, AMQP_URL, scratch, service_env
from peers import PY, VENV, ensure_venv

from harness.helpers import Procs, SyncDB
from jobq.client.producer import Client
from jobq.newjob import NewJob
from jobq.settings import Settings

TICKS = os.sysconf("SC_CLK_TCK")
PEERS = ("pgqueuer", "procrastinate", "celery")


def _cpu_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


def _beam_pid() -> int | None:
    out = subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    return pids[0] if pids else None


class Meter:
    """Transactions and backend CPU of one database, and the broker's CPU."""

    def __init__(self, db_name: str) -> None:
        self.admin = SyncDB(ADMIN_URL)
        self.db_name = db_name
        self.beam = _beam_pid()

    def _sample(self) -> tuple[float, dict[int, float], float]:
        self.admin.val("SELECT pg_stat_clear_snapshot()")
        xacts = self.admin.val("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                               "WHERE datname = $1", self.db_name)
        pids = [r["pid"] for r in self.admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            self.db_name)]
        return float(xacts), {p: _cpu_of(p) for p in pids}, \
            _cpu_of(self.beam) if self.beam else 0.0

    def measure(self, seconds: float) -> dict[str, float]:
        x0, cpu0, b0 = self._sample()
        time.sleep(seconds)
        x1, cpu1, b1 = self._sample()
        backend_cpu = sum(cpu1[p] - cpu0.get(p, 0.0) for p in cpu1)
        return {"db_xacts_per_s": round((x1 - x0) / seconds, 2),
                "db_backend_cpu_pct": round(100 * backend_cpu / seconds, 3),
                "db_backends": len(cpu1),
                "broker_cpu_pct": round(100 * (b1 - b0) / seconds, 2)}

    def close(self) -> None:
        self.admin.close()


class Latencies:
    """UDP datagrams of handlers: each carries publish -> start in seconds,
    after the job's index in the payload ("i"), if it had one."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.values: list[float] = []
        self.by_index: dict[int, float] = {}
        threading.Thread(target=self._recv, daemon=True).start()

    def _recv(self) -> None:
        while True:
            fields = self.sock.recv(64).split()
            if len(fields) == 2:
                self.by_index[int(fields[0])] = float(fields[1])
            self.values.append(float(fields[-1]))


def _split(started: dict[int, float], returned: dict[int, float]) -> dict[str, Any]:
    """Publish -> handler start, p50/p99/max, and its two parts: the publish
    call (row committed, broker confirmed) and the rest (delivery, claim,
    start; negative when the delivery beat the confirm back), for every job
    and for the slowest 2 %: which part the tail comes from."""
    both = sorted((started[i] * 1000, returned[i] * 1000) for i in started if i in returned)
    total = [s for s, _ in both]
    call = sorted(r for _, r in both)
    rest = sorted(s - r for s, r in both)
    tail = both[-max(1, len(both) // 50):]
    return {"n": len(total), "p50": round(statistics.median(total), 2),
            "p99": round(_pct(total, 0.99), 2), "max": round(max(total), 2),
            "publish_call_p50_p99": [round(statistics.median(call), 2), round(_pct(call, .99), 2)],
            "rest_p50_p99": [round(statistics.median(rest), 2), round(_pct(rest, .99), 2)],
            "slowest_2pct_total_call_ms": [[round(s, 1), round(r, 1)] for s, r in tail]}


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def jobq(workers: int, seconds: float) -> dict[str, Any]:
    with scratch(("lat",)) as (db_url, amqp_url, namespace):
        name = db_url.rsplit("/", 1)[1].split("?")[0]
        lat = Latencies()
        env = service_env(db_url, amqp_url, namespace, LAT_PORT=str(lat.port),
                          PYTHONPATH=str(HERE) + os.pathsep + str(HERE.parent))
        procs = Procs(env, Path(tempfile.mkdtemp(prefix="jobq-idle-")))
        fleet = [procs.start("consume", "latency_app:app") for _ in range(workers)]
        for c in fleet:
            c.worker_id()
        meter = Meter(name)
        # Past start-up, and past PostgreSQL's stats flush: a backend reports
        # its transactions up to 10 s late (PGSTAT_IDLE_INTERVAL), so the
        # start-up statements of a fleet would land in the window.
        time.sleep(15)
        out: dict[str, Any] = {"consumers_only": meter.measure(seconds / 2)}
        procs.start("reap")
        time.sleep(15)
        out["with_one_reaper"] = meter.measure(seconds / 2)
        settings = Settings(database_url=db_url, amqp_url=amqp_url, namespace=namespace)

        returned: dict[int, float] = {}  # publish call: the row's commit and the confirm

        async def publish() -> None:
            async with Client(settings) as client:
                for i in range(200):
                    t = time.time()
                    await client.publish_many([NewJob("lat", {"t": t, "i": i})])
                    returned[i] = time.time() - t
                    await asyncio.sleep(0.05)

        asyncio.run(publish())
        deadline = time.monotonic() + 30
        while len(lat.values) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        out["publish_to_start_ms"] = _split(lat.by_index, returned)
        meter.close()
        procs.close()
        return out


def _peer(name: str, workers: int, seconds: float) -> dict[str, Any]:
    with scratch(queues=()) as (db_url, _amqp, _ns):
        db_name = db_url.rsplit("/", 1)[1].split("?")[0]
        env = {**os.environ, "PEER_DATABASE_URL": db_url, "PGDSN": db_url,
               "PEER_AMQP_URL": AMQP_URL, "PEER_QUEUE": f"celery-idle-{db_name[-8:]}",
               "PEER_POOL_MAX": "3", "PYTHONPATH": str(HERE)}
        if name == "pgqueuer":
            subprocess.run([str(VENV / "bin" / "pgq"), "install"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            argv = [str(PY), str(HERE / "peer_pgqueuer.py"), "worker"]
        elif name == "procrastinate":
            subprocess.run([str(PY), str(HERE / "peer_procrastinate.py"), "setup"], env=env,
                           check=True)
            argv = [str(PY), str(HERE / "peer_procrastinate.py"), "serve", "8"]
        else:
            argv = [str(PY), str(HERE / "peer_celery.py"), "worker", "solo"]
        procs = [subprocess.Popen(argv, env=env, cwd=HERE, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for _ in range(workers)]
        try:
            time.sleep(15)  # past start-up and the stats flush (as jobq's)
            meter = Meter(db_name)
            out = meter.measure(seconds)
            meter.close()
            out["workers_alive"] = sum(p.poll() is None for p in procs)
            return out
        finally:
            for p in procs:
                p.kill()
                p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--systems", nargs="*", default=["jobq", *PEERS],
                    choices=["jobq", *PEERS])
    a = ap.parse_args()
    print(f"idle cost: {a.workers} workers per system, {a.seconds:g} s idle", flush=True)
    report: dict[str, Any] = {}
    if "jobq" in a.systems:
        report["jobq"] = jobq(a.workers, a.seconds)
        print(json.dumps({"jobq": report["jobq"]}), flush=True)
    if set(a.systems) & set(PEERS):
        ensure_venv()
        for name in (p for p in PEERS if p in a.systems):
            try:
                report[name] = _peer(name, a.workers, a.seconds)
            except Exception as exc:  # a peer failing must not hide the others
                report[name] = {"error": repr(exc)}
            print(json.dumps({name: report[name]}), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
