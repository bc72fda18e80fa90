"""Property-based tests of the input surface against running services (issue
#13): random message bodies, payloads, queue names and setting values. After
every example the services are alive, every valid job completes, and the
CLI answers invalid input in one line with the documented exit code."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aio_pika
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness.helpers import Proc, Procs, SyncDB, job, publish, run_cli, wait_until
from jobq.app import check_queue_name
from jobq.errors import BadInput, InvalidPayload
from jobq.queues import BY_COLUMN
from jobq.settings import Settings

pytestmark = pytest.mark.e2e

EXAMPLES = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False, width=32),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


@pytest.fixture
def services(procs: Procs, db: SyncDB) -> Proc:
    procs.reaper()
    consumer = procs.consumer("--concurrency", "8")
    consumer.worker_id()
    return consumer


def _raw(amqp_url: str, namespace: str, body: bytes) -> None:
    async def go() -> None:
        conn = await aio_pika.connect(amqp_url)
        ch = await conn.channel()
        ex = await ch.get_exchange(namespace)
        await ex.publish(aio_pika.Message(body), routing_key="work")
        await conn.close()

    asyncio.run(go())


@EXAMPLES
@given(body=st.binary(max_size=300) | st.text(max_size=60).map(str.encode))
def test_any_message_body_costs_nothing(services: Any, db: SyncDB, settings: Settings,
                                        amqp_url: str, body: bytes) -> None:
    _raw(amqp_url, settings.namespace, body)
    (jid,) = publish(settings, "work", [{}])
    wait_until(lambda: job(db, jid)["status"] == "completed", 15, "a valid job after junk")
    assert services.alive()


@EXAMPLES
@given(payload=json_values)
def test_any_json_payload_completes_or_is_refused_in_one_line(services: Any, db: SyncDB,
                                                              settings: Settings,
                                                             payload: Any) -> None:
    if _has_nul(payload):  # jsonb cannot store NUL: refused, nothing written
        before = db.val("SELECT count(*) FROM jobq.job")
        with pytest.raises(InvalidPayload, match="NUL character"):
            publish(settings, "work", [{"data": payload}])
        assert db.val("SELECT count(*) FROM jobq.job") == before
        return
    (jid,) = publish(settings, "work", [{"data": payload}])
    wait_until(lambda: job(db, jid)["status"] == "completed", 15, "the job completed")
    stored = job(db, jid)["payload"]
    assert json.loads(stored)["data"] is not None or payload is None
    assert services.alive()


@EXAMPLES
@given(name=st.text(max_size=110))
@example(name="-:")  # once found at random: an option to argparse
def test_any_queue_name_gets_a_job_or_one_line(env: dict[str, str], db: SyncDB, name: str) -> None:
    if "\x00" in name:  # not passable as a process argument at all
        return
    try:
        check_queue_name(name)
        valid = True
    except BadInput:
        valid = False
    # "--": a name that starts with "-" is then a name, not an option (found
    # by this test: "-:" got argparse's usage and exit 2, not jobq's line)
    out = run_cli(env, "publish", "--", name, "{}")
    if valid:
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode == 1, (name, out.returncode, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("jobq: error: "), out.stderr


@EXAMPLES
@given(value=st.text(min_size=1, max_size=30).filter(lambda v: not v.startswith("-")
                                                     and "\x00" not in v))
def test_any_setting_value_is_taken_or_refused_in_one_line(env: dict[str, str], db: SyncDB,
                                                           value: str) -> None:
    try:
        BY_COLUMN["lease_s"].parse(value)
        valid = True
    except Exception:
        valid = False
    out = run_cli(env, "queue", "set", "prop", "--lease-seconds", value)
    assert out.returncode == (0 if valid else 1), (value, out.stderr)
    if not valid:
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
