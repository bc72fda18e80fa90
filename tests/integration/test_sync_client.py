"""jobq.SyncClient (issue #32, part of DESIGN's contract): sync code on
threads shares one pool and one broker connection per process, every
publish lands once; a forked child (gunicorn's preforking) uses connections
of its own; a closed client says so."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.helpers import SyncDB
from jobq import ClientClosed, NewJob, SyncClient
from jobq.settings import Settings


def test_threads_share_one_client_and_every_publish_lands_once(settings: Settings,
                                                               db: SyncDB) -> None:
    client = SyncClient(settings)
    try:
        def worker(t: int) -> list[str]:
            return [str(client.publish("web", {"t": t, "i": i})) for i in range(200)]

        with ThreadPoolExecutor(16) as pool:
            ids = [i for batch in pool.map(worker, range(16)) for i in batch]
        app = settings.database_url.rsplit("/", 1)[-1]
        conns = db.val("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                       "'jobq-producer' AND datname = $1", app)
        more = client.publish_many([NewJob("web", {"n": 1}), NewJob("web", {"n": 2})])
    finally:
        client.close()
    assert len(set(ids)) == 3200
    assert db.val("SELECT count(*) FROM jobq.job WHERE queue = 'web'") == 3202 and len(more) == 2
    assert 1 <= conns <= 10, conns  # one pool for all 16 threads, not a connection per call
    with pytest.raises(ClientClosed, match="create a new one"):
        client.publish("web", {})


def test_a_forked_child_publishes_on_connections_of_its_own(settings: Settings,
                                                            db: SyncDB) -> None:
    client = SyncClient(settings)
    try:
        client.publish("web", {"who": "parent"})
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its own loop and connections, then out
            try:
                client.publish("web", {"who": "child"})
                os.write(w, b"ok")
            except BaseException as exc:  # reported to the parent
                os.write(w, repr(exc).encode()[:500])
            finally:
                os._exit(0)
        os.close(w)
        said = os.read(r, 1000)
        os.waitpid(pid, 0)
        assert said == b"ok", said
        client.publish("web", {"who": "parent again"})  # the parent's connections still work
        assert threading.active_count() >= 1
    finally:
        client.close()
    assert sorted(db.val("SELECT array_agg(payload->>'who') FROM jobq.job")) == [
        "child", "parent", "parent again"]
