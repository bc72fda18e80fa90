"""A rolling upgrade from the previous release (issue #36): its consumers,
reaper and producer work on a schema its own `jobq migrate` made; this
release's `jobq migrate` runs under that load; then each process is replaced
by this release's, one at a time (SIGTERM: drain, release). Nothing lost,
nothing completed twice (each job's completion is logged once, whichever
release ran it), no stall charged, no error in any log. And every statement
of the previous release still prepares against this release's schema.

The previous release is a git ref of this repository (UPGRADE_FROM), unpacked
from the repository's own history and run from source with this venv's
dependencies: no network."""

from __future__ import annotations

import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from harness.helpers import Proc, Procs, wait_until
from harness.scratch import admin, delete_namespace_of, with_db

ROOT = Path(__file__).resolve().parents[2]
UPGRADE_FROM = os.environ.get("JOBQ_TEST_UPGRADE_FROM", "cc01651")  # the release before this one
pytestmark = pytest.mark.e2e
JOBS_OLD, JOBS_NEW = 240, 80

PRODUCER = """
import asyncio, random, sys
from jobq import Client, NewJob

async def main(n: int, rate: float, tag: str) -> None:
    async with Client() as client:
        for i in range(n):
            job = (NewJob("echo", {"n": i, "by": tag}) if i % 2 else
                   NewJob("sleep", {"seconds": round(random.uniform(0.05, 0.3), 2)}))
            await client.publish_many([job])
            await asyncio.sleep(1 / rate)

asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]))
"""


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{UPGRADE_FROM}^{{commit}}"],
            capture_output=True).returncode != 0:
        pytest.skip(f"the previous release {UPGRADE_FROM} is not in this clone's history")
    where = tmp_path_factory.mktemp("old-release")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", UPGRADE_FROM, "services",
                              "schema"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


@pytest.fixture
def fresh_db(pg_admin_url: str, amqp_url: str, namespace: str) -> Iterator[str]:
    """An empty database: the previous release's migrate makes its schema."""
    name = f"jobq_up_{uuid.uuid4().hex[:8]}"
    asyncio.run(admin(pg_admin_url, f"CREATE DATABASE {name}"))
    url = with_db(pg_admin_url, name)
    yield url
    # Every queue the demo app declared, from this database: the namespace
    # fixture reads the suite's own, which names none of them (a list of two
    # here left the other two behind on each run).
    asyncio.run(delete_namespace_of(url, amqp_url, namespace,
                                    ["echo", "sleep", "flaky", "crash"]))
    asyncio.run(admin(pg_admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def _old_env(env: dict[str, str], old: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{old / 'services'}{os.pathsep}{env['PYTHONPATH']}"}


def _producer(procs: Procs, env: dict[str, str], name: str, n: int, tag: str,
              **extra: str) -> Proc:
    p = Proc(name, ["-c", PRODUCER, str(n), "30", tag], {**env, **extra}, procs.logdir, raw=True)
    procs.procs.append(p)
    return p


def test_a_rolling_upgrade_under_load_loses_nothing(
        env: dict[str, str], fresh_db: str, old_release: Path, procs: Procs) -> None:
    # procs after fresh_db: its processes stop before fresh_db deletes the
    # broker queues, or a robust consumer declares its queue again.
    # Every process on the fresh database as its owner (the test's per-role
    # logins belong to the suite's own database).
    env = {k: v for k, v in env.items() if not k.startswith("JOBQ_TEST_LOGIN_")}
    env["JOBQ_DATABASE_URL"] = fresh_db
    procs.env = env
    old = _old_env(env, old_release)
    migrate = subprocess.run([sys.executable, "-m", "jobq", "migrate", "--declare"],
                             env={**env, **old}, capture_output=True, text=True, timeout=120)
    assert migrate.returncode == 0, migrate.stderr
    reaper = procs.start("reap", name="old-reaper", environ=old)
    consumers = [procs.start("consume", "jobq.demo:app", "--concurrency", "4",
                             name=f"old-consumer{i}", environ=old) for i in (1, 2)]
    for c in consumers:
        c.wait_log(r"consumer ready", 30)
    old_producer = _producer(procs, env, "old-producer", JOBS_OLD, "old", **old)
    wait_until(lambda: "completed job=" in consumers[0].log() + consumers[1].log(), 30,
               "the previous release running jobs")

    upgrade = subprocess.run([sys.executable, "-m", "jobq", "migrate", "--declare"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert upgrade.returncode == 0, upgrade.stderr  # this release's schema, under load
    replaced = []
    for i, c in enumerate(consumers, 1):  # one at a time: start the new, drain the old
        new = procs.start("consume", "jobq.demo:app", "--concurrency", "4",
                          name=f"new-consumer{i}")
        new.wait_log(r"consumer ready", 30)
        c.signal(15)
        assert c.wait(30) == 0, c.log()[-2000:]
        replaced.append(new)
        if i == 1:
            new_reaper = procs.start("reap", name="new-reaper")
            new_reaper.wait_log(r"sweep|reaper", 30)
            reaper.signal(15)
            assert reaper.wait(30) == 0, reaper.log()[-2000:]
    new_producer = _producer(procs, env, "new-producer", JOBS_NEW, "new")
    assert old_producer.wait(60) == 0, old_producer.log()[-2000:]
    assert new_producer.wait(60) == 0, new_producer.log()[-2000:]

    async def counts() -> asyncpg.Record:
        conn = await asyncpg.connect(fresh_db)
        try:
            row = await conn.fetchrow(
                "SELECT count(*) AS jobs, count(*) FILTER (WHERE status = 'completed') AS done, "
                "coalesce(sum(stalls), 0) AS stalls FROM jobq.job")
            assert row is not None
            return row
        finally:
            await conn.close()

    total = JOBS_OLD + JOBS_NEW
    wait_until(lambda: asyncio.run(counts())["done"] == total, 60, "every job completed")
    final = asyncio.run(counts())
    assert (final["jobs"], final["stalls"]) == (total, 0)
    logs = {p.name: p.log() for p in procs.procs}
    completions = collections.Counter(
        m for text in logs.values() for m in re.findall(r"completed job=(\S+)", text))
    assert len(completions) == total and set(completions.values()) == {1}, (
        [j for j, n in completions.items() if n > 1])
    bad = {name: [ln for ln in text.splitlines() if " ERROR " in ln or "Traceback" in ln]
           for name, text in logs.items()}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_previous_releases_statements_prepare_against_this_schema(
        db_url: str, env: dict[str, str], old_release: Path) -> None:
    """What an old consumer, reaper or producer still running during an
    upgrade sends: each of its named statements (the q_* function calls
    included, with their old arguments) against this release's schema."""
    script = (
        "import asyncio, sys, asyncpg\n"
        "from jobq.sql import Q\n"
        "async def main():\n"
        "    conn = await asyncpg.connect(sys.argv[1])\n"
        "    bad = []\n"
        "    for name, text in sorted(Q.items()):\n"
        "        try:\n"
        "            await conn.prepare(text)\n"
        "        except Exception as exc:\n"
        "            bad.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "    await conn.close()\n"
        "    print('\\n'.join(bad))\n"
        "asyncio.run(main())\n")
    out = subprocess.run([sys.executable, "-c", script, db_url],
                         env={**env, **_old_env(env, old_release)}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", out.stdout
