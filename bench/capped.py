"""What each system asks of PostgreSQL per job, and how far it goes when the
database is the scarce resource (issue #49), in one sitting:

    .venv/bin/python bench/capped.py [--jobs 1000,4000,8000] [--cpus 0.5]
        [--retained 0] [--peers pgqueuer,procrastinate] [--runs 1]

A PostgreSQL server of its own (harness/pg_own.py: own port, pg_stat_statements
loaded), held to --cpus CPUs by a cgroup quota (0: uncapped), reused across
trials: a database per system, TRUNCATE + VACUUM ANALYZE between trials, as an
outside harness would. Per trial: a reaper beside 2 ``jobq consume`` of
concurrency 16 with a no-op handler (their completions counted by UDP pings),
a producer of 16 concurrent single publishes; pgqueuer 1.6 with its 2 workers
and the same producer shape, and procrastinate 3 with 2 workers of
concurrency 16, in the same sitting (Celery keeps nothing in PostgreSQL, so a
database quota does not touch it: it is not a row here). Printed per trial: steady
rate (jobs / (last completion - producer start)), tuples fetched + returned
and buffers hit + read per job (pg_stat_database deltas), the quota's
throttled seconds, and the statements that did most (pg_stat_statements:
calls, rows and buffers per call). --retained N first inserts N finished jobs
(kept by retention) to show the hot path does not read them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness.pg_own import OwnServer

STEADY_CONCURRENCY = 16
WORKERS = 2


def _per_job(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    d = {k: after[k] - before[k] for k in before}
    return {"tuples_per_job": (d["tup_fetched"] + d["tup_returned"]) / n,
            "fetched_per_job": d["tup_fetched"] / n,
            "buffers_per_job": (d["blks_hit"] + d["blks_read"]) / n,
            "commits_per_job": d["xact_commit"] / n}


def _top(pg: OwnServer, db: str, n: int, k: int = 14) -> list[dict[str, Any]]:
    out = []
    for s in pg.statements(db)[:k]:
        calls = max(1, int(s["calls"]))
        out.append({"query": " ".join(str(s["query"]).split())[:90], "calls_per_job":
                    round(calls / n, 3), "rows_per_call": round(s["rows"] / calls, 1),
                    "buffers_per_call": round((s["shared_blks_hit"] + s["shared_blks_read"])
                                              / calls, 1),
                    "ms_per_job": round(s["total_exec_time"] / n, 4)})
    return out


def jobq_trial(pg: OwnServer, n: int, retained: int, audit_every_s: float = 2.0
               ) -> dict[str, Any]:
    import benchenv
    from benchenv import service_env, world
    from publish_path import pings, run_json

    with world(("noop",), "capped", JOBQ_LOG_LEVEL="WARNING",
               JOBQ_REAPER__AUDIT_EVERY_S=str(audit_every_s),  # the invariant monitor (#50.8)
               PYTHONPATH=f"{HERE}{os.pathsep}{HERE.parent}") as w:
        db = w.db_url.rsplit("/", 1)[1]
        w.db.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('noop', 30)")
        if retained:
            w.db.execute("INSERT INTO jobq.job (queue, status, finished_at, lock) "
                         "SELECT 'noop', 'completed', now(), gen_random_uuid() "
                         "FROM generate_series(1, $1)", retained)
        w.db.execute("VACUUM ANALYZE jobq.job")  # as after a TRUNCATE or a prune
        env = service_env(w.db_url, w.amqp_url, w.settings.namespace, JOBQ_LOG_LEVEL="WARNING")
        w.procs.reaper()
        with pings(n + 1) as (port, first, done):
            for _ in range(WORKERS):
                w.procs.start("consume", "ping_app:app", "--concurrency",
                              str(STEADY_CONCURRENCY), PING_PORT=str(port))
            asyncio.run(_one(w.settings))  # a probe job: the consumers are up
            first()
            pg.reset_statements(db)
            time.sleep(0.5)  # the reset reaches the stats collector
            before, throttled = pg.database_stats(db), pg.throttled_s()
            rel = pg.relation_stats(db)
            prod = run_json([sys.executable, str(HERE / "producer_jobq.py"), str(n),
                             str(STEADY_CONCURRENCY)], env)
            end = done()["last"]
            time.sleep(0.6)
            after = pg.database_stats(db)
            out = {"system": "jobq", "jobs": n, "retained": retained,
                   "rate": round(n / (end - prod["t0"]), 1),
                   "throttled_s": round(pg.throttled_s() - throttled, 2),
                   **{k: round(v, 2) for k, v in _per_job(before, after, n).items()},
                   "top": _top(pg, db, n) + _reads(rel, pg.relation_stats(db), n)}
        assert benchenv.ADMIN_URL.startswith(pg.admin_url().rsplit("/", 1)[0])
        return out


def _reads(before: dict[str, int], after: dict[str, int], n: int) -> list[dict[str, Any]]:
    """Where the rows read came from: per table (seq) and index, per job."""
    per = {k: (after.get(k, 0) - before.get(k, 0)) / n for k in after}
    return [{"reads_per_job": round(v, 2), "from": k}
            for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:6] if v > 0.05]


async def _one(settings: Any) -> None:
    from jobq.client.producer import Client

    async with Client(settings) as c:
        await c.publish("noop", {})


def pgqueuer_trial(pg: OwnServer, n: int) -> dict[str, Any]:
    """pgqueuer 1.6: its schema installed (pgq install), 2 workers."""
    from peers import VENV

    return _peer_trial(pg, n, "pgqueuer", "peer_pgqueuer.py", [str(VENV / "bin" / "pgq"),
                                                               "install"],
                       ["worker"], {"PGQ_MAX_TASKS": "0"})


def procrastinate_trial(pg: OwnServer, n: int) -> dict[str, Any]:
    """procrastinate 3: its schema applied, 2 workers of concurrency 16
    waiting for jobs (serve)."""
    from peers import PY

    script = str(HERE / "peer_procrastinate.py")
    return _peer_trial(pg, n, "procrastinate", "peer_procrastinate.py",
                       [str(PY), script, "setup"], ["serve", str(STEADY_CONCURRENCY)],
                       {"PEER_POOL_MAX": "4"})


def _peer_trial(pg: OwnServer, n: int, system: str, script_name: str, setup: list[str],
                worker_args: list[str], worker_env: dict[str, str]) -> dict[str, Any]:
    """A peer in jobq's shape: a database of its own on the capped server,
    ``setup`` run once, 2 workers (``script worker_args``) reporting each
    completion, then 16 concurrent single publishes (``script single``)."""
    import subprocess

    from benchenv import scratch
    from peers import PY, ensure_venv
    from publish_path import peer_workers, pings, run_json

    ensure_venv()
    script = str(HERE / script_name)
    with scratch(queues=()) as (db_url, _amqp, _ns):
        db = db_url.rsplit("/", 1)[1]
        env = {**os.environ, "PEER_DATABASE_URL": db_url, "PGDSN": db_url,
               "PYTHONPATH": str(HERE)}
        subprocess.run(setup, env=env, check=True, cwd=HERE, stdout=subprocess.DEVNULL)
        with pings(n) as (port, _first, done), peer_workers(
                [str(PY), script, *worker_args], {**env, **worker_env}, port):
            time.sleep(2)  # the workers are up (they LISTEN and poll)
            pg.reset_statements(db)
            time.sleep(0.5)
            before, throttled = pg.database_stats(db), pg.throttled_s()
            prod = run_json([str(PY), script, "single", str(n), str(STEADY_CONCURRENCY)],
                            {**env, **worker_env})
            end = done()["last"]
            time.sleep(0.6)
            after = pg.database_stats(db)
        return {"system": system, "jobs": n, "retained": 0,
                "rate": round(n / (end - prod["t0"]), 1),
                "throttled_s": round(pg.throttled_s() - throttled, 2),
                **{k: round(v, 2) for k, v in _per_job(before, after, n).items()},
                "top": _top(pg, db, n)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="1000,4000,8000")
    ap.add_argument("--cpus", type=float, default=0.5, help="0: no quota")
    ap.add_argument("--retained", type=int, default=0)
    ap.add_argument("--peers", default="pgqueuer",
                    help="comma-separated: pgqueuer, procrastinate; or none (Celery keeps "
                    "nothing in PostgreSQL: a database quota does not touch it)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--audit-every", type=float, default=2.0,
                    help="the reapers' invariant monitor, seconds between checks (0: off)")
    ap.add_argument("--top", action="store_true", help="print the top statements too")
    args = ap.parse_args()
    with OwnServer() as pg:
        how = pg.cap(args.cpus) if args.cpus else "no quota"
        os.environ["JOBQ_TEST_DATABASE_URL"] = pg.admin_url()
        print(f"capped: PostgreSQL of its own on port {pg.port}, {how}; "
              f"{WORKERS} workers of concurrency {STEADY_CONCURRENCY}, "
              f"{STEADY_CONCURRENCY} concurrent single publishes", flush=True)
        rows = []
        for _ in range(args.runs):
            for n in (int(x) for x in args.jobs.split(",")):
                trials = [jobq_trial(pg, n, args.retained, args.audit_every)]
                peers = args.peers.split(",")
                if "pgqueuer" in peers:
                    trials.append(pgqueuer_trial(pg, n))
                if "procrastinate" in peers:
                    trials.append(procrastinate_trial(pg, n))
                for t in trials:
                    top = t.pop("top")
                    print(json.dumps(t), flush=True)
                    if args.top:
                        for s in top:
                            print("    " + json.dumps(s), flush=True)
                    rows.append(t)
                for peer in trials[1:]:
                    print(json.dumps({"jobs": n, f"rate_ratio_jobq_over_{peer['system']}": round(
                        trials[0]["rate"] / peer["rate"], 3), "tuples_ratio": round(
                        trials[0]["tuples_per_job"] / max(peer["tuples_per_job"], 1e-9),
                        3)}), flush=True)


if __name__ == "__main__":
    main()
