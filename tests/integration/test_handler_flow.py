"""Flow decided by the handler (issue #51, items 2 and 3): jobq.Snooze puts
a job back for a while without counting the run; jobq.RateLimited does the
same and holds the job's key (the whole queue, for a job without a key)
fleet-wide until then. Real consumer and reaper, the database's clock."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

from jobq.errors import MAX_SNOOZES
from jobq.newjob import NewJob
from jobq.settings import Settings
from tests.integration.test_consumer import World, _app_db, scenario  # noqa: F401


async def _starts(w: World, jid: uuid.UUID) -> list[Any]:
    """Each run's start, by the database clock, in order."""
    return [r["started_at"] for r in await w.pool.fetch(
        "SELECT started_at FROM test_run WHERE job_id = $1 ORDER BY n", jid)]


async def _snoozed(w: World, jid: uuid.UUID) -> None:
    """Until the job's first run has put it back (its snoozes count is 1)."""
    for _ in range(500):
        if (await w.row(jid))["snoozes"]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {jid} was never put back")


async def _events(w: World, jid: uuid.UUID) -> list[str]:
    return [r["event"] for r in await w.pool.fetch(
        "SELECT event FROM jobq.job_event WHERE job_id = $1 ORDER BY at, n", jid)]


def test_a_snoozed_job_runs_again_later_without_counting_a_run(settings: Settings) -> None:
    async def body(w: World) -> None:
        (jid,) = await w.publish("work", {"snooze_runs": 2, "snooze_s": 0.3})
        row = await w.wait_status(jid, "completed")
        assert (row["attempts"], row["snoozes"], row["errors"]) == (1, 2, 0), dict(row)
        assert row["last_error"] is None
        starts = await _starts(w, jid)
        assert len(starts) == 3
        assert all((b - a).total_seconds() >= 0.3 for a, b in itertools.pairwise(starts)), starts
        assert (await _events(w, jid)).count("snoozed") == 2

    scenario(settings, body, max_attempts=1)  # a counted run would have failed it


def test_snoozes_are_capped_and_a_bad_snooze_fails_at_once(settings: Settings) -> None:
    async def body(w: World) -> None:
        (spent,) = await w.client.publish_many(
            [NewJob("work", {"snooze_runs": 1}, delay_s=1.0)])
        await w.pool.execute("UPDATE jobq.job SET snoozes = $2 WHERE id = $1", spent,
                             MAX_SNOOZES)
        (bad,) = await w.publish("work", {"snooze_runs": 1, "snooze_s": -1})
        row = await w.wait_status(spent, "failed")
        assert f"snoozed {MAX_SNOOZES} times" in row["last_error"], dict(row)
        row = await w.wait_status(bad, "failed")
        assert "Snooze(seconds)" in row["last_error"] and row["attempts"] == 1, dict(row)
        assert len(await _starts(w, bad)) == 1  # no retry loop

    scenario(settings, body, max_attempts=3)


def test_rate_limited_holds_its_key_fleet_wide_and_charges_nothing(settings: Settings) -> None:
    async def body(w: World) -> None:
        (a,) = await w.client.publish_many([NewJob("work", {"rate_limit_s": 1.5}, key="k1")])
        await _snoozed(w, a)
        until = await w.pool.fetchval(
            "SELECT until FROM jobq.key_hold WHERE queue = 'work' AND key = 'k1'")
        b, c = await w.client.publish_many([NewJob("work", {}, key="k1"),
                                            NewJob("work", {}, key="k2")])
        await w.wait_status(c, "completed")  # another key goes on
        for jid in (a, b):
            done = await w.wait_status(jid, "completed")
            assert (await _starts(w, jid))[-1] >= until, "a job of the held key started early"
        assert (done["attempts"], (await w.row(a))["attempts"]) == (1, 1)
        assert (await w.row(a))["errors"] == 0 and "rate_limited" in await _events(w, a)

    scenario(settings, body, max_attempts=1)


def test_rate_limited_without_a_key_holds_the_whole_queue(settings: Settings) -> None:
    async def body(w: World) -> None:
        (d,) = await w.publish("work", {"rate_limit_s": 1.5})
        await _snoozed(w, d)
        until = await w.pool.fetchval(
            "SELECT until FROM jobq.key_hold WHERE queue = 'work' AND key = ''")
        e, f = await w.client.publish_many([NewJob("work", {}), NewJob("work", {}, key="k3")])
        for jid in (d, e, f):
            await w.wait_status(jid, "completed")
            assert (await _starts(w, jid))[-1] >= until, "a job of the held queue started early"

    scenario(settings, body)
