"""procrastinate: python peer_procrastinate.py setup | fill N | worker C (exits once the
queue is empty: a drain) | serve C (waits for jobs, as a deployed worker does)
| paced RATE SECONDS CONCURRENCY (jobs of task "lat", publish time as argument t)
| single N CONCURRENCY (CONCURRENCY tasks deferring one "noop" job per call, the
shape of jobq's single publishes; prints {"t0", "t1", "cpu_s"}). A "noop" run
reports its completion by UDP to PING_PORT when set (bench/pingcount.py)."""
import asyncio
import json
import os
import socket
import sys
import time

import pace
import procrastinate

# PEER_POOL_MAX: the connection pool's size (its default, 10, times 20 idle
# workers is over PostgreSQL's max_connections of 100 here)
_pool = {"min_size": 1, "max_size": int(os.environ["PEER_POOL_MAX"])} \
    if os.environ.get("PEER_POOL_MAX") else {}
app = procrastinate.App(connector=procrastinate.PsycopgConnector(
    conninfo=os.environ["PEER_DATABASE_URL"], **_pool))


_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_ping = int(os.environ.get("PING_PORT", "0"))


@app.task(name="noop", queue="noop")
async def noop() -> None:
    if _ping:  # completion reported by UDP (bench/pingcount.py)
        _sock.sendto(b"1", ("127.0.0.1", _ping))


@app.task(name="lat", queue="lat")
async def lat(t: float) -> None:
    # publish -> handler start, reported to bench/latency.py (LAT_PORT)
    _sock.sendto(str(time.time() - t).encode(),
                 ("127.0.0.1", int(os.environ.get("LAT_PORT", "9"))))


async def paced(rate: float, seconds: float, concurrency: int) -> None:
    """CONCURRENCY tasks deferring single "lat" jobs, RATE a second in all, on
    a fixed beat (open loop, as bench/peer_pgqueuer.py's paced)."""
    sent = await pace.paced(rate, seconds, concurrency, lambda _: lat.defer_async(t=time.time()))
    print(json.dumps({"sent": sent}), flush=True)


async def single(n: int, concurrency: int) -> None:
    left = [n]

    async def one() -> None:
        while left[0] > 0:
            left[0] -= 1
            await noop.defer_async()

    c0, t0 = os.times(), time.time()
    await asyncio.gather(*(one() for _ in range(concurrency)))
    t1, c1 = time.time(), os.times()
    print(json.dumps({"t0": t0, "t1": t1, "cpu_s": c1.user + c1.system - c0.user - c0.system}),
          flush=True)


async def main() -> None:
    async with app.open_async():
        if sys.argv[1] == "setup":
            await app.schema_manager.apply_schema_async()
        elif sys.argv[1] == "fill":
            n = int(sys.argv[2])
            for i in range(0, n, 1000):
                await noop.batch_defer_async(*[{} for _ in range(min(1000, n - i))])
        elif sys.argv[1] == "single":
            await single(int(sys.argv[2]), int(sys.argv[3]))
        elif sys.argv[1] == "paced":
            await paced(float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
        else:
            await app.run_worker_async(queues=["noop", "lat"], concurrency=int(sys.argv[2]),
                                       wait=sys.argv[1] == "serve",
                                       install_signal_handlers=False)


if __name__ == "__main__":
    asyncio.run(main())
