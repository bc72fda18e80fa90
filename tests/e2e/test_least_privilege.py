"""Runtime RabbitMQ users without configure permission (issue #14): the
topology is declared once by `jobq declare`; producer, consumer and reaper
then only check that it exists, and jobs flow (the whole e2e suite already
runs each service as its own database role and broker user)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.helpers import Procs, SyncDB, run_cli, wait_until
from harness.scratch import BrokerLogins


@pytest.fixture
def no_configure(amqp_url: str, namespace: str) -> Iterator[BrokerLogins]:
    if not BrokerLogins.available(amqp_url):
        pytest.skip("needs rabbitmqctl for a broker on this machine to make users")
    users = BrokerLogins(amqp_url, namespace, prefix=namespace, configure=False, tag="nc")
    try:
        users.setup()
        yield users
    finally:
        users.drop()


def test_services_without_configure_permission_run_on_a_declared_topology(
        env: dict[str, str], db: SyncDB, procs: Procs, no_configure: BrokerLogins) -> None:
    consumer_env = {"JOBQ_AMQP_URL": no_configure.url("consumer")}
    # Before `jobq declare`: nothing to check against, one line and exit 2.
    early = run_cli({**env, **consumer_env}, "consume", "harness.apps:app", "--queue", "work")
    assert early.returncode == 2 and "may not declare" in early.stderr, early.stderr[-800:]

    out = run_cli(env, "declare", "work")  # the migrate step's user (here: guest)
    assert out.returncode == 0 and "1 queue(s)" in out.stdout, out.stderr

    consumer = procs.consumer("--queue", "work", environ=consumer_env)
    consumer.worker_id()
    procs.reaper(JOBQ_AMQP_URL=no_configure.url("reaper"))
    cli = run_cli({**env, "JOBQ_AMQP_URL": no_configure.url("producer")}, "publish", "work")
    assert cli.returncode == 0, cli.stderr
    by_sql = db.val("SELECT jobq.enqueue('work', '{}')")  # the reaper relays it
    wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'") == 2,
               20, "both jobs to complete")
    assert db.val("SELECT status FROM jobq.job WHERE id = $1", by_sql) == "completed"
    assert "refused" not in consumer.log() and "Traceback" not in consumer.log()
