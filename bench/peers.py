"""Peers on the same no-op workload, in their own virtualenv (bench/.venv-peers,
created on first use; never project dependencies): Celery on RabbitMQ with
acks_late (solo pool, and Celery's default prefork pool), procrastinate and
pgqueuer on PostgreSQL. Each fills a backlog of
N jobs, then two worker processes drain it. The rate runs from the first
finished job to the last (polled every 20 ms), so start-up is not counted."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import aiormq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from harness.helpers import SyncDB

VENV = HERE / ".venv-peers"
PY = VENV / "bin" / "python"
PINS = ["celery==5.7.0", "procrastinate==3.10.0", "pgqueuer==1.6.0", "psycopg[binary]==3.3.9",
        "asyncpg==0.32.0"]
WORKERS = 2


def ensure_venv() -> None:
    if PY.exists():
        return
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(PY), "-m", "pip", "install", "-q", *PINS], check=True)


def drain_rate(n: int, done: Callable[[], int], workers: list[subprocess.Popen[bytes]],
               timeout: float = 600) -> float:
    first = None
    t_end = time.monotonic() + timeout
    while True:
        d = done()
        now = time.monotonic()
        if first is None and d > 0:
            first = (now, d)
        if d >= n:
            break
        if now > t_end or all(w.poll() is not None for w in workers):
            raise RuntimeError(f"peer drained {d} of {n}")
        time.sleep(0.02)
    for w in workers:
        w.kill()
        w.wait()
    assert first is not None
    return (n - first[1]) / max(1e-6, now - first[0])


class _Count:
    """A count polled every 20 ms over one connection: a new connection per
    poll (50 backends forked a second) would tax the system being measured."""

    def __init__(self, db_url: str, sql: str) -> None:
        self.db, self.sql = SyncDB(db_url), sql

    def __call__(self) -> int:
        return int(self.db.val(self.sql))

    def close(self) -> None:
        self.db.close()


def celery(amqp_url: str, n: int, pool: str = "solo") -> float:
    queue = f"celery-bench-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PEER_AMQP_URL": amqp_url, "PEER_QUEUE": queue}
    subprocess.run([str(PY), str(HERE / "peer_celery.py"), "fill", str(n)], env=env, check=True,
                   cwd=HERE)

    async def open_channel() -> tuple[Any, Any]:
        conn = await aio_pika.connect(amqp_url)
        return conn, await conn.channel()

    loop = asyncio.new_event_loop()  # one connection for the 20 ms polls
    conn, channel = loop.run_until_complete(open_channel())

    def ready() -> int:
        q = loop.run_until_complete(channel.declare_queue(queue, passive=True))
        return int(q.declaration_result.message_count or 0)

    async def delete() -> None:
        conn = await aio_pika.connect(amqp_url)
        try:
            await (await conn.channel()).queue_delete(queue)
        except aiormq.exceptions.AMQPError:
            pass
        finally:
            await conn.close()

    workers = [subprocess.Popen([str(PY), str(HERE / "peer_celery.py"), "worker", pool], env=env,
                                cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(WORKERS)]
    try:
        return drain_rate(n, lambda: n - ready(), workers)
    finally:
        loop.run_until_complete(conn.close())
        loop.close()
        asyncio.run(delete())


def procrastinate(db_url: str, n: int) -> float:
    env = {**os.environ, "PEER_DATABASE_URL": db_url}
    script = str(HERE / "peer_procrastinate.py")
    subprocess.run([str(PY), script, "setup"], env=env, check=True, cwd=HERE)
    subprocess.run([str(PY), script, "fill", str(n)], env=env, check=True, cwd=HERE)
    workers = [subprocess.Popen([str(PY), script, "worker", "32"], env=env, cwd=HERE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(WORKERS)]
    done = _Count(db_url, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
    try:
        return drain_rate(n, done, workers)
    finally:
        done.close()


def pgqueuer(db_url: str, n: int) -> float:
    env = {**os.environ, "PEER_DATABASE_URL": db_url, "PGDSN": db_url}
    subprocess.run([str(VENV / "bin" / "pgq"), "install"], env=env, check=True, cwd=HERE,
                   stdout=subprocess.DEVNULL)
    subprocess.run([str(PY), str(HERE / "peer_pgqueuer.py"), "fill", str(n)], env=env,
                   check=True, cwd=HERE)
    workers = [subprocess.Popen([str(PY), str(HERE / "peer_pgqueuer.py"), "worker"],
                                env={**env, "PYTHONPATH": str(HERE)}, cwd=HERE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(WORKERS)]
    left = _Count(db_url, "SELECT count(*) FROM pgqueuer")
    try:
        return drain_rate(n, lambda: n - left(), workers)
    finally:
        left.close()


def pgqueuer_steady(db_url: str, n: int) -> float:
    """Producer and 2 workers together: from the producer's start until the
    queue is empty (workers started and idle first, so start-up is not
    counted)."""
    env = {**os.environ, "PEER_DATABASE_URL": db_url, "PGDSN": db_url}
    subprocess.run([str(VENV / "bin" / "pgq"), "install"], env=env, check=True, cwd=HERE,
                   stdout=subprocess.DEVNULL)
    workers = [subprocess.Popen([str(PY), str(HERE / "peer_pgqueuer.py"), "worker"],
                                env={**env, "PYTHONPATH": str(HERE)}, cwd=HERE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(WORKERS)]
    left = _Count(db_url, "SELECT count(*) FROM pgqueuer")
    try:
        # Idle workers poll; a probe job finishing shows both are up.
        subprocess.run([str(PY), str(HERE / "peer_pgqueuer.py"), "fill", "2"], env=env,
                       check=True, cwd=HERE)
        t_end = time.monotonic() + 60
        while left():
            assert time.monotonic() < t_end, "pgqueuer workers did not start"
            time.sleep(0.05)
        t0 = time.monotonic()
        producer = subprocess.Popen([str(PY), str(HERE / "peer_pgqueuer.py"), "produce",
                                     str(n)], env=env, cwd=HERE)
        while producer.poll() is None or left():
            assert time.monotonic() - t0 < 600, "pgqueuer steady run did not finish"
            time.sleep(0.02)
        if producer.returncode:
            raise RuntimeError(f"pgqueuer producer exited {producer.returncode}")
        return n / (time.monotonic() - t0)
    finally:
        left.close()
        for w in workers:
            w.kill()
            w.wait()


def run_peers(n: int) -> dict[str, float]:
    from benchenv import AMQP_URL, scratch

    ensure_venv()
    out: dict[str, float] = {}
    for name, fn in (("celery", None), ("celery_prefork", None),
                     ("procrastinate", procrastinate), ("pgqueuer", pgqueuer),
                     ("pgqueuer_steady", pgqueuer_steady)):
        try:
            if fn is None:
                pool = "prefork" if name.endswith("prefork") else "solo"
                out[f"{name}_drain_per_s"] = celery(AMQP_URL, n, pool)
            else:
                with scratch(queues=()) as (db_url, _amqp, _ns):
                    key = name if name.endswith("steady") else f"{name}_drain"
                    out[f"{key}_per_s"] = fn(db_url, n)
        except Exception as exc:  # a peer failing must not hide the others
            print(f"peer {name} failed: {exc!r}", file=sys.stderr)
    return out


if __name__ == "__main__":
    print(run_peers(int(sys.argv[1]) if len(sys.argv) > 1 else 20000))
