"""Backlog you can alert on (issue #50, item 5; schema 0030): a queued job is
ready, delayed, waiting for parents, parked by limits or suspended, and
only ready jobs count as the queue's wait. The figures in SQL
(jobq.backlog, jobq.queue_stats), in ``jobq stats``, and as a real reaper
process's gauges on /metrics; the alert rules and the KEDA example use only
what jobq exports and what a reader login may read."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.helpers import Procs, SyncDB, free_port, http, run_cli, set_queue, wait_until
from jobq.client.producer import Client
from jobq.newjob import NewJob
from jobq.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
STATES = ("ready", "delayed", "waiting", "parked", "suspended")


def _publish_every_state(settings: Settings, db: SyncDB, queue: str) -> dict[str, Any]:
    """3 ready (2 plain, key A's first), 1 delayed, 1 waiting for a parent, 2 of
    key A parked at the door (its cap is 1): each made the way users make it."""
    set_queue(db, queue, max_running_per_key=1)

    async def go() -> list[uuid.UUID]:
        async with Client(settings) as client:
            plain = await client.publish_many([NewJob(queue, {"n": i}) for i in range(2)])
            await client.publish(queue, {}, delay_s=600)
            await client.publish(queue, {}, after=[plain[0]])
            await client.publish_many([NewJob(queue, {}, key="A") for _ in range(3)])
            return plain

    asyncio.run(go())
    return {"ready": 3, "delayed": 1, "waiting": 1, "parked": 2, "suspended": 0}


def test_each_queued_job_counts_in_one_state_and_only_ready_ones_wait(
        settings: Settings, db: SyncDB, env: dict[str, str]) -> None:
    want = _publish_every_state(settings, db, "bk")
    row = db.fetchrow("SELECT * FROM jobq.backlog WHERE queue = 'bk'")
    assert {s: row[s] for s in STATES} == want, dict(row)
    assert row["oldest_ready_s"] >= 0
    # queue_stats: "queued" is what could start now; before schema 0030 the
    # waiting and parked jobs counted there too (6, not 3)
    stats = db.fetchrow("SELECT * FROM jobq.queue_stats WHERE queue = 'bk'")
    assert (stats["queued"], stats["delayed"], stats["waiting"], stats["parked"],
            stats["suspended"]) == (3, 1, 1, 2, 0), dict(stats)
    shown = run_cli(env, "stats")
    assert shown.returncode == 0, shown.stderr
    header = shown.stdout.splitlines()[0].split()
    assert {"waiting", "parked", "suspended"} <= set(header), header
    # an empty queue: zeros and no wait, not NULLs
    set_queue(db, "bk_empty")
    empty = db.fetchrow("SELECT * FROM jobq.backlog WHERE queue = 'bk_empty'")
    assert [empty[s] for s in STATES] == [0] * 5 and empty["oldest_ready_s"] == 0


Gauges = dict[tuple[str, str], float]


def _gauges(port: int) -> Gauges:
    status, body = http(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    out: Gauges = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == "jobq_queue_depth":
                out[(s.labels["queue"], s.labels["state"])] = s.value
            elif s.name == "jobq_queue_oldest_wait_seconds":
                out[(s.labels["queue"], "oldest")] = s.value
            elif s.name == "jobq_queue_suspended":  # issue #52: by what they wait for
                out[(s.labels["queue"], s.labels["reason"])] = s.value
            elif s.name == "jobq_queue_oldest_suspended_seconds":
                out[(s.labels["queue"], "oldest_suspended")] = s.value
    return out


def test_a_reaper_exports_the_backlog_and_drops_a_deleted_queue(
        settings: Settings, db: SyncDB, procs: Procs, env: dict[str, str]) -> None:
    want = _publish_every_state(settings, db, "bk")
    # and one job suspended for a signal, as job.wait_for leaves it (the
    # suspend statement's columns; test_suspension.py makes them for real)
    db.execute("UPDATE jobq.job SET started_at = now() - interval '1 s', suspended_at = now(), "
               "wake_on = 'go', run_at = now() + interval '1 h', relay_after = now() + "
               "interval '1 h' WHERE id = $1", db.val("SELECT jobq.enqueue('bk')"))
    want["suspended"] = 1
    set_queue(db, "bk_gone")
    port = free_port()
    procs.reaper(JOBQ_HEALTH_PORT=str(port), JOBQ_REAPER__BACKLOG_EVERY_S="0.2")

    def sampled() -> Gauges | None:
        try:
            g = _gauges(port)
        except OSError:
            return None
        return g if ("bk_gone", "ready") in g and ("bk", "parked") in g else None

    got = wait_until(sampled, 30, "the reaper's first backlog sample")
    assert got is not None
    assert {s: got[("bk", s)] for s in STATES} == want, got
    assert got[("bk", "oldest")] >= 0
    assert [got[("bk", r)] for r in ("sleep", "signal", "children")] == [0, 1, 0], got
    assert got[("bk", "oldest_suspended")] >= 0
    assert run_cli(env, "queue", "delete", "bk_gone").returncode == 0
    wait_until(lambda: ("bk_gone", "ready") not in _gauges(port), 30,
               "the deleted queue's series to go")


def _alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((ROOT / "deploy/prometheus/jobq-alerts.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_alert_rules_parse_as_promql_and_use_only_what_jobq_exports() -> None:
    from jobq.telemetry import metrics

    exported = {"up"}
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    for family in metrics.REGISTRY.collect():
        exported |= {family.name + sfx for sfx in suffixes[family.type]}
    rules = _alert_rules()
    names = {r["alert"] for r in rules}
    # what issue #50 asks for: backlog growing, oldest wait, stalled now,
    # failures, reaper not ready, consumer gone
    assert {"JobqBacklogGrowing", "JobqOldestWaitHigh", "JobqStalledNow", "JobqJobsFailing",
            "JobqReaperNotSweeping", "JobqConsumerGone"} <= names, names
    for rule in rules:
        promql_parser.parse(rule["expr"])  # raises on a syntax error
        used = set(re.findall(r"\b(?:jobq_[a-z_]+|up)\b(?=\s*[{\[)])", rule["expr"]))
        assert used and used <= exported, (rule["alert"], used - exported)
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_the_keda_query_runs_as_a_reader_login(settings: Settings, db: SyncDB,
                                               env: dict[str, str]) -> None:
    _publish_every_state(settings, db, "default")
    docs = list(yaml.safe_load_all((ROOT / "deploy/keda/scaledobject.yaml").read_text()))
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    consumer = yaml.safe_load((ROOT / "deploy/k8s/consumer.yaml").read_text())
    assert scaled["spec"]["scaleTargetRef"]["name"] == consumer["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]

    async def as_reader() -> Any:
        conn = await asyncpg.connect(env["JOBQ_TEST_LOGIN_READER"])
        try:
            return await conn.fetchval(query)
        finally:
            await conn.close()

    assert asyncio.run(as_reader()) == 3  # ready only: not delayed, waiting or parked
