"""Handlers used by the tests. Every handler start is logged in
``public.test_run`` (own connection, committed at once), so a test can count
from the database how many times a handler started, in which worker, and how
each run ended."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import asyncpg
from pydantic import BaseModel

from jobq import App, Fail, Job, RateLimited, Retry, Snooze, job_context

app = App()
_pool: asyncpg.Pool | None = None
_creating: asyncio.Future[asyncpg.Pool] | None = None


async def _db() -> asyncpg.Pool:
    """One pool per process, created once even when handlers race for it."""
    global _pool, _creating
    if _pool is not None:
        return _pool
    if _creating is None or _creating.get_loop() is not asyncio.get_running_loop():
        pooled = os.environ.get("JOBQ_DATABASE_POOLED", "").lower() in ("1", "true")
        _creating = asyncio.ensure_future(  # behind PgBouncer: no kept prepared statements
            asyncpg.create_pool(os.environ["JOBQ_DATABASE_URL"], min_size=1, max_size=8,
                                statement_cache_size=0 if pooled else 100))
    _pool = await asyncio.shield(_creating)
    return _pool


async def start(job: Job) -> None:
    pool = await _db()
    await pool.execute(
        "INSERT INTO test_run (job_id, worker, attempt, lock, pid) VALUES ($1,$2,$3,$4,$5)",
        job.id, job.worker_id, job.attempt, job.lock, os.getpid())


async def end(job: Job, outcome: str) -> None:
    # The run is named by its claim's token, not by start()'s n: a cancel can
    # land while start()'s INSERT is committed but its reply not yet read (a
    # consumer SIGCONTed past its lease: the reply and the self-fence are due
    # in one loop pass), and then there is no n.
    pool = await _db()
    await pool.execute("UPDATE test_run SET outcome = $3, ended_at = clock_timestamp() "
                       "WHERE job_id = $1 AND lock = $2 AND outcome IS NULL",
                       job.id, job.lock, outcome)


async def _work(job: Job) -> Any:
    p = job.payload or {}
    try:
        await start(job)
        if p.get("kill_on_attempt") and job.attempt <= int(p["kill_on_attempt"]):
            os.kill(os.getpid(), signal.SIGKILL)
        if p.get("sleep_first") is not None and job.attempt == 1:
            await asyncio.sleep(float(p["sleep_first"]))
        await asyncio.sleep(float(p.get("sleep", 0)))
        if p.get("fail_times") and job.attempt <= int(p["fail_times"]):
            raise RuntimeError(f"boom on attempt {job.attempt}")
        if p.get("retry_in") is not None and job.attempt == 1:
            raise Retry("come back later", delay_s=float(p["retry_in"]))
        if p.get("fail_now"):
            raise Fail("cannot ever work")
        if p.get("deep_key"):
            settings_lookup({})
        await _flow(job, p, await _runs(job))
        if p.get("bad_step"):  # a step result that is not JSON: refused on every run
            await job.step("bad", _not_json)
    except asyncio.CancelledError:
        await asyncio.shield(end(job, "cancelled"))
        raise
    await end(job, "returned")


async def _runs(job: Job) -> int:
    """How many runs of this job started, this one included (test_run)."""
    pool = await _db()
    return int(await pool.fetchval("SELECT count(*) FROM test_run WHERE job_id = $1", job.id))


async def _flow(job: Job, p: dict[str, Any], run: int) -> None:
    """{"snooze_runs": n, "snooze_s": s}: the first n runs snooze s seconds;
    {"rate_limit_s": s}: the first run is rate limited for s seconds."""
    if p.get("snooze_runs") and run <= int(p["snooze_runs"]):
        raise Snooze(p.get("snooze_s", 0.2), f"run {run} snoozed")
    if p.get("rate_limit_s") is not None and run == 1:
        raise RateLimited(float(p["rate_limit_s"]), "429 from the API")


def _not_json() -> object:
    return {1, 2}


def settings_lookup(config: dict[str, Any]) -> Any:
    """{"deep_key": true}: a KeyError two frames below the handler, whose
    traceback must name this file, these functions and their lines."""
    return read_setting(config, "x")


def read_setting(config: dict[str, Any], name: str) -> Any:
    return config[name]


@app.handler("work")
async def work(job: Job) -> None:
    await _work(job)


@app.handler("results")
async def results(job: Job) -> Any:
    """Returns payload["return"]; reports progress first when asked:
    payload["progress"] values, payload["every"] seconds apart."""
    await _work(job)
    p = job.payload or {}
    for value in p.get("progress", []):
        await job.progress(value)
        await asyncio.sleep(float(p.get("every", 0)))
    await asyncio.sleep(float(p.get("hold", 0)))
    if "bytes" in p:
        return "x" * int(p["bytes"])
    return p.get("return")


@app.handler("prio")
async def prio(job: Job) -> None:
    """Flow control (priorities): records its run in test_run."""
    await _work(job)


@app.handler("fair")
async def fair(job: Job) -> None:
    """Flow control (per-key caps, pause): records its run in test_run."""
    await _work(job)


@app.handler("limited")
async def limited(job: Job) -> None:
    """For fleet-wide limits: records its run (start and end) in test_run."""
    await _work(job)


@app.handler("other")
async def other(job: Job) -> None:
    await _work(job)


@app.handler("chain")
async def chain(job: Job) -> None:
    """bench/hostile.py's 1,000-long chain, cancelled at its head while it runs."""
    await _work(job)


@app.handler("suicide")
async def suicide(job: Job) -> None:
    await start(job)
    os.kill(os.getpid(), signal.SIGKILL)


class Email(BaseModel):
    to: str
    subject: str


@app.task("typed", payload=Email)  # a typed handle: typed.publish(Email(...))
async def typed(job: Job[Email]) -> None:
    assert isinstance(job.payload, Email)
    await _work(Job(job.id, job.queue, {}, job.attempt, job.lock, job.worker_id))


@app.handler("ordered")  # a fifo queue in bench/nemesis.py
async def ordered(job: Job) -> None:
    await _work(job)


@app.handler("newest")  # a latest queue in bench/nemesis.py
async def newest(job: Job) -> None:
    await _work(job)


@app.handler("single")  # a singleton queue in bench/nemesis.py
async def single(job: Job) -> None:
    await _work(job)


@app.handler("waits")
async def waits(job: Job) -> Any:
    """job.sleep and job.wait_for (issue #52): harness/waits.py."""
    from harness.waits import waits as run

    return await run(job, start, end)


@app.handler("waits_sync")
def waits_sync(job: Job) -> Any:
    """The sync twins (job.sleep_sync, ...) in the thread pool: harness/waits.py."""
    from harness.waits import waits_sync as run

    return run(job)


@app.handler("emits")
async def emits(job: Job) -> Any:
    """job.emit (issue #52): harness/emits.py."""
    from harness.emits import emits as run

    return await run(job, start, end)


@app.handler("emits_sync")
def emits_sync(job: Job) -> Any:
    from harness.emits import emits_sync as run

    return run(job)


@app.handler("echo")
async def echo(job: Job) -> None:
    """Records the payload exactly as the handler received it."""
    pool = await _db()
    await pool.execute(
        "INSERT INTO test_run (job_id, worker, attempt, lock, pid, outcome) "
        "VALUES ($1,$2,$3,$4,$5,$6)", job.id, job.worker_id, job.attempt, job.lock, os.getpid(),
        __import__("json").dumps({"type": type(job.payload).__name__, "payload": job.payload}))


@app.handler("sync")
def sync_handler(job: Job) -> None:
    """Blocks its thread; must not starve the heartbeat."""
    path = os.path.join(os.environ.get("JOBQ_TEST_RUNLOG", "/tmp"), f"sync-{job.id}")
    with open(path, "a") as f:
        f.write(f"start {job.attempt} {job.worker_id}\n")
    if (job.payload or {}).get("deep_key"):
        settings_lookup({})
    for value in (job.payload or {}).get("progress", []):
        job.progress_sync(value)  # from this thread (issue #50)
    deadline = time.monotonic() + float((job.payload or {}).get("sleep", 0))
    while time.monotonic() < deadline:
        time.sleep(0.05)  # a CPU- or IO-bound sync handler
    with open(path, "a") as f:
        f.write("end\n")


async def _once(sql: str, *args: Any) -> Any:
    # --pool process children inherit no JOBQ_*_URL (the consumer's
    # credentials, issue #28): they record runs through the harness's own.
    conn = await asyncpg.connect(os.environ.get("HARNESS_DATABASE_URL")
                                 or os.environ["JOBQ_DATABASE_URL"])
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


@app.handler("proc")
def proc(job: Job) -> None:
    """A sync handler that records its runs in test_run, for --pool process:
    it can kill its own process, hang, sleep, or spin the CPU."""
    n = asyncio.run(_once(
        "INSERT INTO test_run (job_id, worker, attempt, lock, pid) VALUES ($1,$2,$3,$4,$5) "
        "RETURNING n", job.id, job.worker_id, job.attempt, job.lock, os.getpid()))
    p = job.payload or {}
    if p.get("kill_self_on_attempt") and job.attempt <= int(p["kill_self_on_attempt"]):
        os.kill(os.getpid(), signal.SIGKILL)
    if p.get("hang_on_attempt") and job.attempt <= int(p["hang_on_attempt"]):
        time.sleep(3600)
    time.sleep(float(p.get("sleep", 0)))
    if p.get("deep_key"):
        settings_lookup({})
    runs = asyncio.run(_once("SELECT count(*) FROM test_run WHERE job_id = $1", job.id))
    asyncio.run(_flow(job, p, int(runs)))
    total = 0
    for i in range(int(p.get("work", 0))):
        total += i * i  # CPU-bound: a fixed amount of work, holding the GIL
    asyncio.run(_once("UPDATE test_run SET outcome = 'returned', ended_at = clock_timestamp() "
                      "WHERE n = $1 RETURNING n", n))


@app.handler("big")
def big(job: Job) -> Any:
    """Sync, for --pool process: a large payload in, a large result out, and
    which of the consumer's secrets its process inherited (none should)."""
    p = job.payload or {}
    if p.get("step"):  # a child process has no database link: steps cannot run here
        job.step_sync("s", lambda: 1)
    return {"got": len(p.get("blob", "")), "blob": "y" * int(p.get("result_bytes", 0)),
            "secrets": sorted(k for k in os.environ if k.startswith("JOBQ_") and "URL" in k)}


@app.task("proc_typed", payload=Email)
def proc_typed(job: Job[Email]) -> Any:
    """A typed sync task, for --pool process: the child checks the payload."""
    assert isinstance(job.payload, Email)
    return {"to": job.payload.to, "pid": os.getpid()}


@app.handler("wf")
async def wf(job: Job) -> Any:
    """Workflows: a step that records its run, sleeps, may kill its process
    on its first attempts, and returns its attempt (dependants read it)."""
    await _work(job)
    return {"attempt": job.attempt}


@app.handler("wf_callback")
async def wf_callback(job: Job) -> Any:
    """A fan-in's callback: records its run; returns what its parents returned."""
    await _work(job)
    parents = await job.parents()
    return {"parents": len(parents),
            "attempts": sorted(str(v["attempt"]) for v in parents.values() if v)}


async def _count(name: str) -> int:
    """An external side effect: bumps a counter outside jobq's tables."""
    return int(await _once("INSERT INTO test_counter (name, n) VALUES ($1, 1) ON CONFLICT (name) "
                           "DO UPDATE SET n = test_counter.n + 1 RETURNING n", name))


@app.handler("steps")
async def steps(job: Job) -> Any:
    """Three durable steps; on its first attempt the process dies after the
    second (payload "kill_after_step": 2)."""
    await start(job)
    out = [await job.step("one", _count, f"{job.id}:one")]
    out.append(await job.step("two", _count, f"{job.id}:two"))
    if job.attempt == 1 and job.payload.get("kill_after_step") == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    out.append(await job.step("three", _count, f"{job.id}:three"))
    await end(job, "returned")
    return out


@app.handler("txn")
async def txn(job: Job) -> None:
    """Writes its side effect and completes the job in one transaction."""
    pool = await _db()
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO test_run (job_id, worker, attempt, lock, pid, outcome) "
            "VALUES ($1,$2,$3,$4,$5,'returned')",
            job.id, job.worker_id, job.attempt, job.lock, os.getpid())
        await job.complete_in(conn)


@app.handler("context")
async def context(job: Job) -> Any:
    """Returns what jobq.job_context() says inside an async handler."""
    return job_context()


@app.handler("context_sync")
def context_sync(job: Job) -> Any:
    """The same from a sync handler (the consumer's thread pool)."""
    return job_context()
