"""Who is charged for a crash (issue #12), on the SQL alone: requeue_lapsed's
verdicts (own / witness / bystander), isolation, a child's death, and the
quarantine of a job whose claim fails on its own data."""

from __future__ import annotations

import uuid

import asyncpg

from jobq import lease
from jobq.lease import Failure
from tests.integration.test_lease import claim, new_job, status
from tests.integration.test_lease import run as run


async def crash(pool: asyncpg.Pool, worker: str) -> dict[uuid.UUID, str]:
    """The worker's leases all lapse at once (its session ended): verdicts."""
    await pool.execute("UPDATE jobq.job SET lease_expires_at = now() - interval '1 ms' "
                       "WHERE worker_id = $1 AND status = 'active'", worker)
    return {r.id: r.verdict for r in await lease.requeue_lapsed(pool, 500, "r")}


def test_a_shared_crash_charges_nobody_and_a_second_makes_suspects(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        a, b, c = [await new_job(pool) for _ in range(3)]
        for jid in (a, b, c):
            await claim(pool, jid, "crash1")
        assert await crash(pool, "crash1") == {a: "witness", b: "witness", c: "witness"}
        for jid in (a, b, c):
            row = await status(pool, jid)
            # back in line at once, nothing charged, not isolated next time
            assert (row["status"], row["stalls"], row["suspect_stalls"], row["suspect"]) == \
                ("queued", 0, 1, False)
            assert row["run_at"] <= await pool.fetchval("SELECT now()")
        for jid in (a, b):
            await claim(pool, jid, "crash2")
        assert await crash(pool, "crash2") == {a: "witness", b: "witness"}
        assert [(await status(pool, j))["suspect"] for j in (a, b, c)] == [True, True, False]
        assert max([(await status(pool, j))["stalls"] for j in (a, b, c)]) == 0

    run(db_url, body)


def test_an_isolated_suspect_is_charged_alone(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        suspect, other = await new_job(pool), await new_job(pool)
        await pool.execute("UPDATE jobq.job SET suspect = true, suspect_stalls = 2 "
                           "WHERE id = $1", suspect)
        mine = await claim(pool, suspect, "w")
        assert mine is not None and await claim(pool, other, "w") is not None
        assert await lease.isolate(pool, mine) is True
        assert await crash(pool, "w") == {suspect: "own", other: "bystander"}
        s, o = await status(pool, suspect), await status(pool, other)
        assert (s["stalls"], s["isolated"], s["status"]) == (1, False, "queued")
        assert (o["stalls"], o["suspect_stalls"], o["suspect"]) == (0, 1, False)

    run(db_url, body)


def test_a_job_that_keeps_crashing_beside_isolated_suspects_becomes_one(db_url: str) -> None:
    """Found by model/verdict.pml: a poison job that was not a suspect yet,
    running beside an isolated (healthy) suspect, got the suspect charged
    for every crash it caused, and was never marked itself. A bystander is
    now noted as present (suspect_stalls + 1): at its second such crash it is
    a suspect, runs isolated, and its next crash points at it."""
    async def body(pool: asyncpg.Pool) -> None:
        healthy, poison = await new_job(pool, max_stalls=10), await new_job(pool)
        await pool.execute("UPDATE jobq.job SET suspect = true, suspect_stalls = 2 "
                           "WHERE id = $1", healthy)
        for n, worker in enumerate(("w1", "w2"), 1):
            mine = await claim(pool, healthy, worker)
            assert mine is not None and await claim(pool, poison, worker) is not None
            assert await lease.isolate(pool, mine) is True
            assert await crash(pool, worker) == {healthy: "own", poison: "bystander"}
            p = await status(pool, poison)
            assert (p["stalls"], p["suspect_stalls"], p["suspect"]) == (0, n, n >= 2)

    run(db_url, body)


def test_isolate_is_fenced(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool)
        mine = await claim(pool, jid, "w")
        assert mine is not None
        mine.lock = uuid.uuid4()  # not our token
        assert await lease.isolate(pool, mine) is False
        assert (await status(pool, jid))["isolated"] is False

    run(db_url, body)


def test_a_lone_job_is_charged_and_an_error_clears_suspicion(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        alone, failing = await new_job(pool), await new_job(pool)
        await claim(pool, alone, "solo")
        assert await crash(pool, "solo") == {alone: "own"}
        row = await status(pool, alone)
        assert (row["stalls"], row["suspect"]) == (1, True)
        await pool.execute("UPDATE jobq.job SET suspect = true WHERE id = $1", failing)
        again = await claim(pool, failing, "w4")
        assert again is not None
        await lease.fail(pool, [Failure(again, "x", True, 0.0)])
        assert (await status(pool, failing))["suspect"] is False  # it ran and returned

    run(db_url, body)


def test_a_child_death_is_charged_to_its_job_at_once(db_url: str) -> None:
    async def body(pool: asyncpg.Pool) -> None:
        jid = await new_job(pool, max_stalls=1, stall_cooldown_s=30)
        mine = await claim(pool, jid, "w")
        assert mine is not None
        row = await lease.child_died(pool, mine, "killed by SIGKILL")
        assert row is not None
        assert (row.status, row.stalls, row.due) == ("queued", 1, True)
        assert await lease.child_died(pool, mine, "again") is None  # fenced: no longer ours
        mine = await claim(pool, jid, "w")
        assert mine is not None
        row = await lease.child_died(pool, mine, "killed by SIGSEGV")
        assert row is not None
        assert (row.status, row.stalls) == ("failed", 2)
        assert "job of death" in (await status(pool, jid))["last_error"]
        events = [r["event"] for r in await pool.fetch(
            "SELECT event FROM jobq.job_event WHERE job_id = $1 ORDER BY n", jid)]
        assert events.count("child_died") == 1 and events[-1] == "failed"

    run(db_url, body)


def test_quarantine_fails_only_a_job_whose_claim_fails_on_its_data(db_url: str) -> None:
    """The database decides, not the caller (issue #28 H2): a job whose
    claim raises a data error is failed with the server's message; a
    claimable queued job and an active one are left as they were."""
    async def body(pool: asyncpg.Pool) -> None:
        healthy, active = await new_job(pool), await new_job(pool)
        await claim(pool, active, "w")
        await pool.execute("ALTER TABLE jobq.queue DROP CONSTRAINT IF EXISTS queue_lease_s_range")
        await pool.execute("INSERT INTO jobq.queue (name, lease_s) VALUES ('bad', 'NaN')")
        broken: uuid.UUID = await pool.fetchval("SELECT jobq.enqueue('bad', '{}')")
        token = uuid.uuid4()
        assert await lease.quarantine(pool, broken, "w", ["bad"], token) is True
        assert await lease.quarantine(pool, healthy, "w", ["q"], token) is False
        assert await lease.quarantine(pool, active, "w", ["q"], token) is False
        row = await status(pool, broken)
        assert row["status"] == "failed" and row["last_error"].startswith("cannot be claimed: ")
        assert (await status(pool, healthy))["status"] == "queued"  # the trial claim undone
        assert (await status(pool, healthy))["attempts"] == 0
        assert (await status(pool, active))["status"] == "active"

    run(db_url, body)
