"""The long versions of the cluster scenarios (issue #15; the suite runs them
short in tests/e2e/test_cluster.py and test_failover.py):

    .venv/bin/python bench/clusters.py [--seconds 60] [--rate 200]

Producer (single-job publishes at --rate) + 2 consumers + 2 reapers, jobs of
50 ms, for --seconds, against: a 3-node RabbitMQ cluster (the job queue's
leader stopped for 10 s; the node a consumer is connected to stopped for
10 s; 2 of 3 nodes stopped for 5 s) and a PostgreSQL primary + hot standby
(the primary crashed and the standby promoted 1 s later; synchronous, then
asynchronous replication, asynchronous again at 4x the rate, and with the
asynchronous standby held 1 s behind when the primary dies); one consumer on
a host of its own (a network namespace) cut off for 5 s; everything through
PgBouncer in transaction mode with a consumer SIGKILLed. Prints one
table: scenario, jobs, lost (of them: no row at all), completed twice,
re-runs, time to recover (harness/under_load.py says how each is counted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchenv import world

from harness.apps import app
from harness.helpers import Procs, SyncDB, set_queue
from harness.pg_pair import Pair
from harness.rabbit_cluster import Cluster
from harness.scratch import delete_namespace
from harness.under_load import Run, under_load
from jobq.settings import Settings

# Every queue harness.apps declares: deleted with the namespace afterwards.
APP_QUEUES = sorted(app.handlers)
ENV = {"JOBQ_LOG_LEVEL": "INFO", "JOBQ_AMQP_HEARTBEAT_S": "2",
       "JOBQ_REAPER__MAX_SLEEP_S": "0.2", "JOBQ_PRODUCER__RELAY_GRACE_S": "1"}


def on_cluster(cluster: Cluster, seconds: float, rate: float) -> list[dict[str, Any]]:
    out = []
    scenarios: list[tuple[str, Callable[[Run, str], None]]] = [
        ("RabbitMQ cluster: job queue's leader stopped for 10 s", lambda run, ns: _stop(
            run, cluster, [cluster.leader_of(ns, f"{ns}.work")], 10)),
        ("RabbitMQ cluster: a consumer's node stopped for 10 s", lambda run, ns: _stop(
            run, cluster, [cluster.node_of(run.consumers[0].pid)], 10)),
        ("RabbitMQ cluster: 2 of 3 nodes stopped for 5 s", lambda run, ns: _stop(
            run, cluster, [1, 2], 5)),
    ]
    for name, fault in scenarios:
        with world(tuple(APP_QUEUES), "clusters", **ENV) as w:
            ns = w.settings.namespace
            cluster.add_vhost(ns)
            url = cluster.urls(ns)
            set_queue(w.db, "work", lease_s=2.0)
            r = under_load(w.db, w.procs, w.settings.model_copy(update={"amqp_url": url}),
                           lambda run, ns=ns, fault=fault: fault(run, ns),  # type: ignore[misc]
                           env={"JOBQ_AMQP_URL": url}, rate=rate, seconds=seconds,
                           warmup_s=5, timeout_s=180)
            out.append({"scenario": name, **r})
            print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def _stop(run: Run, cluster: Cluster, nodes: list[int], for_s: float) -> None:
    run.mark()
    for i in nodes:
        cluster.stop(i)
    time.sleep(for_s)
    for i in nodes:
        cluster.start_again(i)
        if not run.healed_at:
            run.healed()


def failover(synchronous: bool, seconds: float, rate: float,
             behind_s: float = 0) -> dict[str, Any]:
    pair = Pair(synchronous)
    try:
        pair.start()
        url = pair.create_db(f"jobq_{uuid.uuid4().hex[:6]}")
        db = SyncDB(url)
        set_queue(db, "work", lease_s=2.0)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
        settings = Settings(database_url=url, namespace=f"bench{uuid.uuid4().hex[:8]}")
        env.update(ENV, JOBQ_DATABASE_URL=url, JOBQ_AMQP_URL=settings.amqp_url,
                   JOBQ_NAMESPACE=settings.namespace,
                   PYTHONPATH=str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", ""))
        procs = Procs(env, Path(tempfile.mkdtemp(prefix="jobq-failover-")))

        def fault(run: Run) -> None:
            held = pair.hold_replication() if behind_s else None
            time.sleep(behind_s)
            run.mark()
            pair.crash_primary()
            if held:
                pair.drop_held(held)
            time.sleep(1.0)
            pair.promote()
            run.healed()

        try:
            r = under_load(db, procs, settings, fault, rate=rate, seconds=seconds, warmup_s=5,
                           timeout_s=180, tolerate_refusals=True)
        finally:
            procs.close()
            asyncio.run(delete_namespace(settings.amqp_url, settings.namespace, APP_QUEUES))
            db.close()
    finally:
        pair.close()
    kind = "synchronous" if synchronous else "asynchronous"
    lag = f", standby {behind_s:.0f} s behind" if behind_s else ""
    return {"scenario": f"PostgreSQL failover, {kind} standby{lag}, {rate:.0f} jobs/s", **r}


def partition(seconds: float, rate: float, cut_for_s: float = 5) -> dict[str, Any]:
    """One of the 2 consumers on a host of its own, cut off for ``cut_for_s``
    under load (its jobs self-fence, run again elsewhere), then healed."""
    from harness.helpers import as_role
    from harness.netns import Host

    host = Host()
    try:
        with world(tuple(APP_QUEUES), "partition", **ENV) as w:
            set_queue(w.db, "work", lease_s=2.0)
            role_env = as_role(w.procs.env, ["consume"])
            there = {"JOBQ_DATABASE_URL": host.forward("db", role_env["JOBQ_DATABASE_URL"]),
                     "JOBQ_AMQP_URL": host.forward("mq", role_env["JOBQ_AMQP_URL"])}

            def start(i: int) -> Any:
                if i == 0:
                    return w.procs.consumer("--concurrency", "8", wrap=host.argv, environ=there)
                return w.procs.consumer("--concurrency", "8")

            def fault(run: Run) -> None:
                run.mark()
                host.cut()
                time.sleep(cut_for_s)
                host.heal()
                run.healed()

            r = under_load(w.db, w.procs, w.settings, fault, rate=rate, seconds=seconds,
                           warmup_s=5, timeout_s=180, start_consumer=start)
            w.procs.close()
    finally:
        host.close()
    return {"scenario": f"a consumer's host cut off for {cut_for_s:.0f} s", **r}


def pgbouncer(seconds: float, rate: float) -> dict[str, Any]:
    """Everything through PgBouncer (transaction mode), a consumer SIGKILLed
    under load."""
    from benchenv import ADMIN_URL

    from harness.pgbouncer import PgBouncer

    bouncer = PgBouncer(ADMIN_URL)
    bouncer.start()
    try:
        with world(tuple(APP_QUEUES), "pgbouncer", **ENV) as w:
            set_queue(w.db, "work", lease_s=2.0)
            url = bouncer.url(w.db_url)
            env = {"JOBQ_DATABASE_URL": url, "JOBQ_DATABASE_POOLED": "true",
                   "JOBQ_DIRECT_DATABASE_URL": w.db_url}
            settings = w.settings.model_copy(update={
                "database_url": url, "database_pooled": True, "direct_database_url": w.db_url})

            def fault(run: Run) -> None:
                run.mark()
                run.consumers[0].kill()
                run.consumers.append(w.procs.consumer("--concurrency", "8", environ=env))

            r = under_load(w.db, w.procs, settings, fault, env=env, rate=rate,
                           seconds=seconds, warmup_s=5, timeout_s=180)
    finally:
        bouncer.close()
    return {"scenario": "through PgBouncer (transaction mode), a consumer SIGKILLed", **r}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--rate", type=float, default=200)
    p.add_argument("--only", choices=["partition", "pgbouncer"],
                   help="run just this scenario")
    a = p.parse_args()
    if a.only:
        row = {"partition": partition, "pgbouncer": pgbouncer}[a.only](a.seconds, a.rate)
        print(json.dumps(row))
        return
    rows: list[dict[str, Any]] = []
    cluster = Cluster(3)
    try:
        cluster.start()
        rows += on_cluster(cluster, a.seconds, a.rate)
    finally:
        cluster.close()
    for sync, rate, behind in ((True, a.rate, 0), (False, a.rate, 0), (False, a.rate * 4, 0),
                               (False, a.rate, 1.0)):
        rows.append(failover(sync, a.seconds, rate, behind))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    for more in (partition, pgbouncer):
        rows.append(more(a.seconds, a.rate))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"{a.seconds:.0f} s of load per scenario, lease 2 s, jobs of 50 ms")
    print("| scenario | jobs | lost (no row) | completed twice | re-runs | recovered |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        back = r.get("back_after_heal_s") if "2 of 3" in r["scenario"] else r["recovered_s"]
        print(f"| {r['scenario']} | {r['jobs']} | {r['lost']} ({r['vanished']}) | "
              f"{r['completed_twice']} | {r['reruns']} | {back} s |")


if __name__ == "__main__":
    main()
