"""Celery on RabbitMQ, acks_late (crash-safe in the same sense as jobq):
    python peer_celery.py fill N | produce N CONCURRENCY | worker [solo|prefork]
    | paced RATE SECONDS CONCURRENCY (tasks "lat", publish time as argument t)

produce: CONCURRENCY threads, each with its own producer, publish one task
per call with publisher confirms (kombu's confirm_publish), as a web app
enqueueing a task per request; prints {"t0", "t1", "cpu_s"} as JSON. With
PING_PORT set, each task reports its completion by UDP (bench/pingcount.py).

solo runs tasks in the worker process itself (Celery's fastest pool for
no-op tasks); prefork is Celery's default (children = CPU count)."""
import json
import os
import socket
import sys
import threading
import time

from celery import Celery

app = Celery("peer", broker=os.environ["PEER_AMQP_URL"])
app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True,
                worker_prefetch_multiplier=4, task_ignore_result=True,
                task_default_queue=os.environ["PEER_QUEUE"],
                broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False, broker_pool_limit=64,
                broker_transport_options={"confirm_publish": True})
_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_port = int(os.environ.get("PING_PORT", "0"))


@app.task(name="noop")
def noop() -> None:
    if _port:
        _sock.sendto(b"1", ("127.0.0.1", _port))


@app.task(name="lat")
def lat(t: float) -> None:
    # publish -> handler start, reported to bench/latency.py (LAT_PORT)
    _sock.sendto(str(time.time() - t).encode(),
                 ("127.0.0.1", int(os.environ.get("LAT_PORT", "9"))))


def paced(rate: float, seconds: float, concurrency: int) -> None:
    """CONCURRENCY threads, each with its own producer, publishing single
    "lat" tasks, RATE a second in all, on a fixed beat (open loop)."""
    start = time.monotonic() + 0.2
    period = concurrency / rate
    sent = [0]
    lock = threading.Lock()

    def one(i: int) -> None:
        with app.producer_or_acquire() as producer:
            k = 0
            while True:
                at = start + (k + i / concurrency) * period
                if at - start > seconds or time.monotonic() - start > seconds:
                    return
                time.sleep(max(0.0, at - time.monotonic()))
                lat.apply_async((time.time(),), producer=producer)
                with lock:
                    sent[0] += 1
                k += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"sent": sent[0]}), flush=True)


def produce(n: int, concurrency: int) -> None:
    left = [n]
    lock = threading.Lock()

    def one() -> None:
        with app.producer_or_acquire() as producer:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                noop.apply_async(producer=producer)

    threads = [threading.Thread(target=one) for _ in range(concurrency)]
    c0, t0 = os.times(), time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t1, c1 = time.time(), os.times()
    print(json.dumps({"t0": t0, "t1": t1, "cpu_s": c1.user + c1.system - c0.user - c0.system}))


if __name__ == "__main__":
    if sys.argv[1] == "paced":
        paced(float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "produce":
        produce(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "fill":
        with app.producer_or_acquire() as producer:
            for _ in range(int(sys.argv[2])):
                noop.apply_async(producer=producer)
    else:
        pool = sys.argv[2] if len(sys.argv) > 2 else "solo"
        app.worker_main(["worker", f"--pool={pool}", "--loglevel=WARNING", "--without-gossip",
                         "--without-mingle", "--without-heartbeat",
                         f"--hostname=w{os.getpid()}@%h"])  # several on one machine
