"""Celery on RabbitMQ, acks_late (crash-safe in the same sense as jobq):
    python peer_celery.py fill N | worker [solo|prefork]

solo runs tasks in the worker process itself (Celery's fastest pool for
no-op tasks); prefork is Celery's default (children = CPU count)."""
import os
import sys

from celery import Celery

app = Celery("peer", broker=os.environ["PEER_AMQP_URL"])
app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True,
                worker_prefetch_multiplier=4, task_ignore_result=True,
                task_default_queue=os.environ["PEER_QUEUE"],
                broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False)


@app.task(name="noop")
def noop() -> None:
    return None


if __name__ == "__main__":
    if sys.argv[1] == "fill":
        with app.producer_or_acquire() as producer:
            for _ in range(int(sys.argv[2])):
                noop.apply_async(producer=producer)
    else:
        pool = sys.argv[2] if len(sys.argv) > 2 else "solo"
        app.worker_main(["worker", f"--pool={pool}", "--loglevel=WARNING", "--without-gossip",
                         "--without-mingle", "--without-heartbeat"])
