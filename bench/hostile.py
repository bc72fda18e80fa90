"""Hostile and careless producers for the randomized fault schedule (issue
#47, I11: nobody else's work can stop yours), beside nemesis.py's faults.

Two producer logins of their own (alice, mallory) keep doing, at random:

- an open dependency transaction: ``after => [a job running now]`` in a
  transaction held longer than the lease (2-4 s), then committed or rolled
  back; before schema 0024 it held the parent's row and froze the renewals
  of every job of its worker;
- a debounce storm: both logins publish debounced jobs of the same keys,
  each payload naming its login (the checker: no job carries another
  login's payload);
- trace records that cannot be read (a string that is no trace context; a
  non-string value is refused by the table's CHECK, counted);
- a 1,000-long chain (queue ``chain``), whose current head is cancelled by an
  operator while it runs: the rest is cancelled by the reapers' settler, a
  bounded batch a sweep;
- payloads nested 985 deep into a ``--pool process`` queue (``big``): decoded
  in the child or failed with the reason, never a lost child.

What the checker adds (``report``): chain jobs not terminal, debounced jobs
with another login's payload, deep payloads not terminal, and whether the
reapers' sweeps went on to the end (seconds since the oldest reaper's last
sweep, duties failing).
"""

from __future__ import annotations

import asyncio
import random
import threading
import uuid
from typing import Any

import asyncpg

from harness.helpers import SyncDB
from harness.scratch import admin, login_url

DEEP = '{"d": ' * 985 + "{}" + "}" * 985


class Hostile:
    def __init__(self, admin_url: str, db_url: str) -> None:
        self.admin_url = admin_url
        self.tag = uuid.uuid4().hex[:6]
        self.password = uuid.uuid4().hex
        self.logins = [f"alice_{self.tag}", f"mallory_{self.tag}"]
        asyncio.run(admin(admin_url, *(f"CREATE ROLE {u} LOGIN PASSWORD '{self.password}' "
                                       "IN ROLE jobq_producer" for u in self.logins)))
        self.urls = [login_url(db_url, u, self.password) for u in self.logins]
        self.counts = {"open_dependency_txns": 0, "debounced": 0, "junk_traces": 0,
                       "traces_refused": 0, "chains": 0, "deep_payloads": 0}

    def close(self) -> None:
        asyncio.run(admin(self.admin_url, *(f"DROP ROLE IF EXISTS {u}" for u in self.logins)))

    def run(self, db_url: str, stop: threading.Event, rng: random.Random) -> None:
        asyncio.run(self._go(db_url, stop, rng))

    async def _go(self, db_url: str, stop: threading.Event, rng: random.Random) -> None:
        owner = await asyncpg.connect(db_url)
        mine = [await asyncpg.connect(u) for u in self.urls]
        try:
            while not stop.is_set():
                kind = rng.random()
                try:
                    if kind < 0.3:
                        await self._open_dependency(owner, rng.choice(mine), rng)
                    elif kind < 0.6:
                        await self._debounce_storm(mine, rng)
                    elif kind < 0.75:
                        await self._junk_trace(owner, rng)
                    elif kind < 0.9:
                        await owner.fetchval("SELECT jobq.enqueue('big', $1::jsonb)", DEEP)
                        self.counts["deep_payloads"] += 1
                    elif not self.counts["chains"]:  # one chain a run: 1,000 jobs
                        await self._chain(owner, rng)
                except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
                    # a fault of nemesis's (a backend killed, the server
                    # restarting): a closed session is opened again, and
                    # while the server refuses, the next turn tries again
                    print(f"  hostile: {type(exc).__name__}; going on", flush=True)
                    try:
                        for i, c in enumerate(mine):
                            if c.is_closed():
                                mine[i] = await asyncpg.connect(self.urls[i])
                        if owner.is_closed():
                            owner = await asyncpg.connect(db_url)
                    except (asyncpg.PostgresError, OSError) as again:
                        print(f"  hostile: cannot reconnect yet ({type(again).__name__})",
                              flush=True)
                await asyncio.sleep(rng.uniform(0.1, 0.5))
        finally:
            for c in [owner, *mine]:
                if not c.is_closed():
                    await c.close()

    async def _open_dependency(self, owner: asyncpg.Connection, mine: asyncpg.Connection,
                               rng: random.Random) -> None:
        running = await owner.fetchval("SELECT id FROM jobq.job WHERE status = 'active' "
                                       "ORDER BY random() LIMIT 1")
        if running is None:
            return
        tx = mine.transaction()
        await tx.start()
        await mine.fetchval("SELECT jobq.enqueue('other', '{\"sleep\": 0.05}', "
                            "after => $1::uuid[])", [running])
        await asyncio.sleep(rng.uniform(2.0, 4.0))  # longer than the lease
        if rng.random() < 0.5:
            await tx.commit()
        else:
            await tx.rollback()
        self.counts["open_dependency_txns"] += 1

    async def _debounce_storm(self, mine: list[asyncpg.Connection],
                              rng: random.Random) -> None:
        for _ in range(5):
            i = rng.randrange(len(mine))
            await mine[i].fetchval(
                "SELECT jobq.enqueue('work', $1::jsonb, key => $2, debounce_s => 0.5)",
                f'{{"sleep": 0.01, "by": "{self.logins[i]}"}}', f"d{rng.randrange(3)}")
            self.counts["debounced"] += 1

    async def _junk_trace(self, owner: asyncpg.Connection, rng: random.Random) -> None:
        jid = await owner.fetchval("SELECT id FROM jobq.job WHERE status = 'queued' "
                                   "ORDER BY random() LIMIT 1")
        if jid is None:
            return
        carrier = '{"traceparent": "not a trace"}' if rng.random() < 0.7 else \
            '{"traceparent": 5}'
        try:
            await owner.execute("INSERT INTO jobq.job_trace VALUES ($1, $2::jsonb) "
                                "ON CONFLICT DO NOTHING", jid, carrier)
            self.counts["junk_traces"] += 1
        except asyncpg.CheckViolationError:
            self.counts["traces_refused"] += 1

    async def _chain(self, owner: asyncpg.Connection, rng: random.Random) -> None:
        """1,000 jobs each after the one before; cancel its head once it runs."""
        ids = await owner.fetchval("""
            WITH RECURSIVE chain(n, id) AS (
                SELECT 1, jobq.enqueue('chain', '{"sleep": 0.3}')
                UNION ALL
                SELECT n + 1, jobq.enqueue('chain', '{"sleep": 0.05}', after => ARRAY[id])
                FROM chain WHERE n < 1000)
            SELECT array_agg(id ORDER BY n) FROM chain""")
        self.counts["chains"] += 1
        for _ in range(200):  # the head runs (or ran)
            if await owner.fetchval("SELECT status <> 'queued' FROM jobq.job WHERE id = $1",
                                    ids[0]):
                break
            await asyncio.sleep(0.05)
        await owner.execute("UPDATE jobq.job SET status = 'cancelled', finished_at = now(), "
                            "lease_expires_at = NULL, last_error = 'cancelled by nemesis' "
                            "WHERE id = $1 AND status IN ('queued', 'active')", ids[0])


def report(db: SyncDB, hostile: Hostile) -> dict[str, Any]:
    """What must be 0 besides nemesis's own counts, and what happened."""
    return {
        **hostile.counts,
        "chain_not_terminal": db.val("SELECT count(*) FROM jobq.job WHERE queue = 'chain' "
                                     "AND status NOT IN ('completed', 'cancelled')"),
        "debounce_merged_across_logins": db.val(
            "SELECT count(*) FROM jobq.job WHERE debounced AND payload ? 'by' "
            "AND payload->>'by' <> enqueued_by"),
        "deep_not_terminal": db.val("SELECT count(*) FROM jobq.job WHERE queue = 'big' "
                                    "AND status NOT IN ('completed', 'failed')"),
        "deep_charged": db.val("SELECT count(*) FROM jobq.job WHERE queue = 'big' "
                               "AND stalls > 0"),
        # a live reaper (swept in the last 10 s) whose last sweep had a duty
        # failing: a statement that cannot run (the unpark once lacked a right)
        "reaper_duties_failing": db.val("SELECT count(*) FROM jobq.reaper_status "
                                        "WHERE failing_since IS NOT NULL "
                                        "AND seconds_since_sweep < 10"),
        "seconds_since_a_sweep": db.val("SELECT round(min(seconds_since_sweep)::numeric, 2) "
                                        "FROM jobq.reaper_status"),
    }


# Must be 0 for a run to pass (with nemesis.FAILURES).
FAILURES = ("chain_not_terminal", "debounce_merged_across_logins", "deep_not_terminal",
            "deep_charged", "reaper_duties_failing")
