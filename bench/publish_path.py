"""The publish path against its peers (issue #16), in one sitting:

    .venv/bin/python bench/publish_path.py [--jobs 20000] [--runs 3] [--concurrency 16]

Per run, interleaved: jobq, Celery 5.7 (RabbitMQ, acks_late, publisher
confirms, solo pool) and pgqueuer 1.6, each with 2 worker processes and a
producer process of --concurrency concurrent single-job publishes (the shape
of a web app enqueueing one job per request). Every system's handler sends
one UDP datagram when it finishes (bench/pingcount.py counts them), so all
are timed alike: steady end to end = jobs / (last completion - producer
start). Also: the producer alone (enqueue rate; PostgreSQL, RabbitMQ and
producer CPU per job from /proc), batches of 100, the broker's own limit
(raw clients, confirmed persistent messages to a quorum queue, 100 in
flight: aio-pika's Exchange.publish and aiormq's with wait=False, the
faster), publish latency on an idle system (one caller), drains of a
backlog with 1 and 2 consumers, and with 2 at twice --concurrency (pgqueuer:
uncapped, its default, and capped at twice --concurrency, the least it takes
with its batch of 10). Medians over runs; ratios taken within each
run, then their median.
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
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import AMQP_URL, scratch, service_env, world
from peers import PY, VENV, ensure_venv

from harness.helpers import wait_until
from jobq.client.producer import Client
from jobq.newjob import NewJob

WORKERS = 2
TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(match: Callable[[str, int], bool]) -> float:
    """CPU seconds used so far by the processes ``match(comm, pid)`` picks,
    and by their children that ended (a PostgreSQL backend's CPU moves to
    the postmaster's cutime when its client disconnects)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
            if match(head.split("(", 1)[1], int(pid)):
                fields = rest.split()
                total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except OSError:
            continue
    return total / TICK


def snapshot(pids: set[int]) -> dict[str, float]:
    return {"pg": cpu_of(lambda c, _: c == "postgres"),
            "mq": cpu_of(lambda c, _: c.startswith("beam")),
            "workers": cpu_of(lambda _, p: p in pids)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def pings(n: int) -> Iterator[tuple[int, Callable[[], None], Callable[[], dict[str, float]]]]:
    """(port, wait for the first ping, wait for all n) of a pingcount process."""
    port = free_port()
    p = subprocess.Popen([sys.executable, str(HERE / "pingcount.py"), str(port), str(n), "60"],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"

    seen = [False]

    def first() -> None:
        assert p.stdout is not None and p.stdout.readline().strip() == "first", "no probe ping"
        seen[0] = True

    def done() -> dict[str, float]:
        assert p.stdout is not None
        if not seen[0]:
            first()
        out: dict[str, float] = json.loads(p.stdout.readline())
        if out["count"] < n:
            raise RuntimeError(f"only {out['count']} of {n} completions reported")
        return out

    try:
        yield port, first, done
    finally:
        p.kill()
        p.wait()


def run_json(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=HERE)
    if out.returncode:
        raise RuntimeError(f"{cmd[1]} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure(n: int, start_producer: Callable[[], dict[str, float]], pids: set[int],
            done: Callable[[], dict[str, float]] | None) -> dict[str, float]:
    """Run the producer (and wait for all completions if ``done``): rates
    and CPU per job over the window."""
    before = snapshot(pids)
    prod = start_producer()
    end = done()["last"] if done else prod["t1"]
    after = snapshot(pids)
    per = {k: (after[k] - before[k]) / n * 1000 for k in before}
    out = {"rate": n / (end - prod["t0"]), "enqueue_rate": n / (prod["t1"] - prod["t0"]),
           "pg_ms": per["pg"], "mq_ms": per["mq"], "producer_ms": prod["cpu_s"] / n * 1000}
    if pids:
        out["workers_ms"] = per["workers"]
    for k in ("lat_p50_ms", "lat_p99_ms"):
        if k in prod:
            out[k] = prod[k]
    return out


# ─────────────────────────────── jobq ───────────────────────────────

def jobq(n: int, concurrency: int) -> dict[str, float]:
    res: dict[str, float] = {}
    with world(("noop",), "publish", JOBQ_LOG_LEVEL="WARNING",
               PYTHONPATH=f"{HERE}{os.pathsep}{HERE.parent}") as w:
        w.db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('noop', 30)")
        env = service_env(w.db_url, w.amqp_url, w.settings.namespace, JOBQ_LOG_LEVEL="WARNING")
        producer = [sys.executable, str(HERE / "producer_jobq.py")]

        def produce(k: int, c: int, batch: int = 1) -> Callable[[], dict[str, float]]:
            return lambda: run_json([*producer, str(k), str(c), str(batch)], env)

        def reset() -> None:
            w.db.execute("TRUNCATE jobq.job, jobq.job_event CASCADE")

        # The producer alone: enqueue rate and its cost per job.
        for key, c, batch in (("jobq_enqueue_single", concurrency, 1),
                              ("jobq_enqueue_batch100", 1, 100)):
            for k, v in measure(n, produce(n, c, batch), set(), None).items():
                res[f"{key}_{k}"] = v
            reset()
        lat = measure(1000, produce(1000, 1), set(), None)
        res["jobq_publish_idle_p50_ms"] = lat["lat_p50_ms"]
        res["jobq_publish_idle_p99_ms"] = lat["lat_p99_ms"]
        reset()
        # Steady end to end, then drains of a backlog.
        with pings(n + 1) as (port, first, done):
            cons = [w.procs.start("consume", "ping_app:app", "--concurrency", str(concurrency),
                                  PING_PORT=str(port)) for _ in range(WORKERS)]
            asyncio.run(_publish(w.settings, 1))
            first()
            for k, v in measure(n, produce(n, concurrency), {c.popen.pid for c in cons},
                                done).items():
                res[f"jobq_steady_{k}"] = v
            for proc in cons:
                proc.kill()
        # The drains at --concurrency, and 2 consumers at twice it
        # (pgqueuer cannot be capped below twice its batch of 10: see below).
        for n_cons, conc, key in ((1, concurrency, "jobq_drain_1c"),
                                  (2, concurrency, "jobq_drain_2c"),
                                  (2, 2 * concurrency, f"jobq_drain_2c_conc{2 * concurrency}")):
            reset()
            asyncio.run(_publish(w.settings, n, batch=1000))
            with pings(n) as (port, _first, done):
                cons = [w.procs.start("consume", "ping_app:app", "--concurrency",
                                      str(conc), PING_PORT=str(port)) for _ in range(n_cons)]
                out = done()
                res[key] = n / (out["last"] - out["first"])
                for proc in cons:
                    proc.kill()
    return res


async def _publish(settings: Any, n: int, batch: int = 1) -> None:
    async with Client(settings) as c:
        for i in range(0, n, batch):
            await c.publish_many([NewJob("noop", {}) for _ in range(min(batch, n - i))])


# ─────────────────────────────── peers ───────────────────────────────

@contextmanager
def peer_workers(argv: list[str], env: dict[str, str], port: int) -> Iterator[set[int]]:
    """WORKERS peer worker processes reporting to ``port``; their pids."""
    workers = [subprocess.Popen(argv, env={**env, "PING_PORT": str(port)}, cwd=HERE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(WORKERS)]
    try:
        yield {w.pid for w in workers}
    finally:
        for w in workers:
            w.kill()
            w.wait()


def peer_shape(prefix: str, n: int, produce: Callable[[], dict[str, float]],
               workers: list[str], env: dict[str, str],
               drained: Callable[[], None]) -> dict[str, float]:
    """A peer in the issue's shape: its producer alone (a backlog of n), then
    its workers drain that backlog (``drained`` returns when it is empty) and
    run steady end to end with the producer again."""
    res = {f"{prefix}_enqueue_single_{k}": v for k, v in measure(n, produce, set(), None).items()}
    with pings(2 * n) as (port, first, done), peer_workers(workers, env, port) as pids:
        first()  # the backlog's first completion: the workers are up
        drained()
        for k, v in measure(n, produce, pids, done).items():
            res[f"{prefix}_steady_{k}"] = v
    return res


def celery(n: int, concurrency: int) -> dict[str, float]:
    queue = f"celery-bench-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PEER_AMQP_URL": AMQP_URL, "PEER_QUEUE": queue}
    script = str(HERE / "peer_celery.py")
    try:
        return peer_shape(
            "celery", n, lambda: run_json([str(PY), script, "produce", str(n), str(concurrency)],
                                          env),
            [str(PY), script, "worker", "solo"], env, lambda: _celery_empty(queue))
    finally:
        asyncio.run(_delete_queue(queue))


def _celery_empty(queue: str) -> None:
    import aio_pika

    async def ready() -> int:
        conn = await aio_pika.connect(AMQP_URL)
        try:
            q = await (await conn.channel()).declare_queue(queue, passive=True)
            return int(q.declaration_result.message_count or 0)
        finally:
            await conn.close()

    wait_until(lambda: asyncio.run(ready()) == 0, 120, "celery backlog drained", interval=0.2)
    time.sleep(0.5)  # the prefetched ones finish


async def _delete_queue(queue: str) -> None:
    import aio_pika

    conn = await aio_pika.connect(AMQP_URL)
    try:
        await (await conn.channel()).queue_delete(queue)
    finally:
        await conn.close()


def pgqueuer(n: int, concurrency: int) -> dict[str, float]:
    from harness.helpers import SyncDB

    script = str(HERE / "peer_pgqueuer.py")
    res: dict[str, float] = {}
    with scratch(queues=()) as (db_url, _amqp, _ns):
        env = {**os.environ, "PEER_DATABASE_URL": db_url, "PGDSN": db_url,
               "PYTHONPATH": str(HERE)}
        subprocess.run([str(VENV / "bin" / "pgq"), "install"], env=env, check=True, cwd=HERE,
                       stdout=subprocess.DEVNULL)

        def drained() -> None:  # timed from the first completion; polled every 50 ms
            t0 = time.time()
            db = SyncDB(db_url)
            try:
                wait_until(lambda: db.val("SELECT count(*) FROM pgqueuer") == 0, 120,
                           "pgqueuer backlog drained", interval=0.05)
            finally:
                db.close()
            res["pgqueuer_drain_2c"] = (n - 1) / (time.time() - t0)

        res.update(peer_shape(
            "pgqueuer", n, lambda: run_json([str(PY), script, "single", str(n),
                                             str(concurrency)], env),
            [str(PY), script, "worker"], env, drained))
        # Drains timed like jobq's (first to last completion ping), with
        # pgqueuer's default (no cap on picked jobs) and capped like jobq's
        # consumers at twice --concurrency.
        for cap, key in ((0, "pgqueuer_drain_2c_pings"),
                         (2 * concurrency, f"pgqueuer_drain_2c_cap{2 * concurrency}")):
            db = SyncDB(db_url)
            try:
                db.execute("TRUNCATE pgqueuer")
            finally:
                db.close()
            subprocess.run([str(PY), script, "fill", str(n)], env=env, check=True, cwd=HERE)
            with pings(n) as (port, _first, done), peer_workers(
                    [str(PY), script, "worker"], {**env, "PGQ_MAX_TASKS": str(cap)}, port):
                out = done()
                res[key] = n / (out["last"] - out["first"])
    return res


def broker_limit(n: int) -> dict[str, float]:
    """Raw clients: confirmed persistent messages to a quorum queue, 100 in
    flight. Two ways: aio-pika's Exchange.publish, and aiormq's publish with
    wait=False (what jobq's broker.publish does). The limit is the faster."""
    import aio_pika
    import aiormq

    async def go() -> tuple[float, float]:
        conn = await aio_pika.connect(AMQP_URL)
        ch = await conn.channel(publisher_confirms=True)
        name = f"raw-bench-{uuid.uuid4().hex[:6]}"
        await ch.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        under = await ch.get_underlay_channel()
        assert isinstance(under, aiormq.Channel)
        body = str(uuid.uuid4()).encode()
        props = aiormq.spec.Basic.Properties(delivery_mode=2)
        rates = []
        for lean in (False, True):
            t0 = time.perf_counter()
            for i in range(0, n, 100):
                k = min(100, n - i)
                if lean:
                    await asyncio.gather(*(under.basic_publish(
                        body, routing_key=name, properties=props, mandatory=True, wait=False)
                        for _ in range(k)))
                else:
                    await asyncio.gather(*(ch.default_exchange.publish(
                        aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=name) for _ in range(k)))
            rates.append(n / (time.perf_counter() - t0))
        await ch.queue_delete(name)
        await conn.close()
        return rates[0], rates[1]

    aio_pika_rate, lean_rate = asyncio.run(go())
    return {"broker_raw_confirmed_per_s": max(aio_pika_rate, lean_rate),
            "broker_raw_aio_pika_per_s": aio_pika_rate, "broker_raw_wait_false_per_s": lean_rate}


def one_run(n: int, concurrency: int) -> dict[str, float]:
    r: dict[str, float] = {}
    for part in (jobq, celery, pgqueuer):
        try:
            r.update(part(n, concurrency))
        except Exception as exc:  # one system failing must not hide the others
            print(f"{part.__name__} failed: {exc!r}", file=sys.stderr)
    r.update(broker_limit(n))
    for a, b in (("jobq_steady_rate", "celery_steady_rate"),
                 ("jobq_steady_rate", "pgqueuer_steady_rate"),
                 ("jobq_enqueue_batch100_enqueue_rate", "broker_raw_confirmed_per_s"),
                 ("jobq_drain_2c", "pgqueuer_drain_2c"),
                 ("jobq_drain_2c", "pgqueuer_drain_2c_pings"),
                 (f"jobq_drain_2c_conc{2 * concurrency}",
                  f"pgqueuer_drain_2c_cap{2 * concurrency}")):
        if a in r and b in r:
            r[f"ratio_{a}_vs_{b}"] = r[a] / r[b]
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--json", default=str(HERE / "results" / "publish_path.json"))
    a = p.parse_args()
    ensure_venv()
    runs = []
    for i in range(a.runs):
        runs.append(one_run(a.jobs, a.concurrency))
        print(f"run {i + 1}: " + json.dumps({k: round(v, 3) for k, v in runs[-1].items()}),
              file=sys.stderr, flush=True)
    keys = sorted({k for r in runs for k in r})
    median = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"jobs": a.jobs, "concurrency": a.concurrency,
                                        "runs": runs, "median": median}, indent=2))
    print(f"jobs {a.jobs}, concurrency {a.concurrency}, {len(runs)} runs (medians)")
    print("| figure | value |\n|---|---:|")
    for k in keys:
        print(f"| {k} | {median[k]:,.3f} |")


if __name__ == "__main__":
    main()
