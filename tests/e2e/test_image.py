"""The image, run for real (issue #35): a base made from Debian's packages,
the image built on it, then `jobq migrate --declare`, two consumer
containers of the demo app and a reaper container, each as its own
least-privileged login, all with host networking against the suite's
PostgreSQL and RabbitMQ. `docker kill` of the consumer holding long jobs:
each runs again in the other container within 3 s (lease 30 s), nothing
lost; `docker stop` of the other drains and releases with no stall. The
containers run as a non-root user on a read-only root filesystem, answer
/healthz and /readyz, and a wrong login exits 2 with one line."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from harness import image
from harness.helpers import SyncDB, as_role, free_port, http, wait_until
from jobq.settings import Settings

# The first run on a machine makes the base (mmdebstrap) and builds every
# layer in the first test's setup: minutes on a slow machine (181 s once,
# past the suite's 180 s), seconds once the engine's data root has them.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
JOBS = 6
SLEEP_S = 40  # longer than the test: every run that ends is a release or a kill


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, float]]:
    why = image.unavailable()
    if why:
        pytest.skip(why)
    with image.engine(tmp_path_factory.mktemp("docker")):
        base_s = image.base_image()
        build_s, size = image.build_image()
        print(f"\nimage {image.IMAGE_TAG}: {size / 1e6:.0f} MB, base made in {base_s:.0f} s "
              f"(0: cached), image built in {build_s:.1f} s")
        yield {"base_s": base_s, "build_s": build_s, "size": size}


class Containers:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.names: list[str] = []

    def run(self, role_args: list[str], *args: str, health_port: int | None = None,
            detach: bool = True, **extra: str) -> Any:
        role = as_role(self.env, role_args)
        name = f"jobq-t-{uuid.uuid4().hex[:8]}"
        envs = {"JOBQ_DATABASE_URL": role["JOBQ_DATABASE_URL"],
                "JOBQ_AMQP_URL": role["JOBQ_AMQP_URL"],
                "JOBQ_NAMESPACE": self.env["JOBQ_NAMESPACE"],
                "JOBQ_HEALTH_PORT": str(health_port or 0), **extra}
        flags = [f"--env={k}={v}" for k, v in envs.items()]
        cmd = ["run", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
               *flags, *(["--detach"] if detach else []), image.IMAGE_TAG, *args]
        out = image.docker(*cmd, check=False, timeout=120)
        self.names.append(name)
        return name if detach else out

    def logs(self, name: str) -> str:
        out = image.docker("logs", name, check=False)
        return out.stdout + out.stderr

    def close(self) -> None:
        for name in self.names:
            image.docker("rm", "--force", name, check=False)


@pytest.fixture
def containers(built: dict[str, float], env: dict[str, str]) -> Iterator[Containers]:
    c = Containers(env)
    yield c
    c.close()


def _status(url: str) -> int:
    """The answer's status; 0 while nothing listens yet."""
    try:
        return http(url)[0]
    except OSError:
        return 0


def _holders(db: SyncDB, ids: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in db.fetch("SELECT id, worker_id FROM jobq.job WHERE id = ANY($1) AND status = "
                      "'active'", ids):
        out.setdefault(r["worker_id"], []).append(r["id"])
    return out


def test_containers_recover_a_killed_consumer_and_drain_on_stop(
        containers: Containers, db: SyncDB, settings: Settings, env: dict[str, str]) -> None:
    out = containers.run(["migrate"], "migrate", "--declare", detach=False)
    assert out.returncode == 0, out.stderr
    ports = [free_port(), free_port(), free_port()]
    consumers = [containers.run(["consume"], "consume", "jobq.demo:app", "--concurrency", "8",
                                health_port=p, JOBQ_CONSUMER__SHUTDOWN_GRACE_S="2")
                 for p in ports[:2]]
    containers.run(["reap"], "reap", health_port=ports[2])
    for p in ports:
        wait_until(lambda: _status(f"http://127.0.0.1:{p}/readyz") == 200, 60,
                   f"/readyz on {p}")
    assert http(f"http://127.0.0.1:{ports[0]}/healthz")[0] == 200
    ready = json.loads(http(f"http://127.0.0.1:{ports[0]}/readyz")[1])
    assert ready["ready"] is True

    # Non-root, and the root filesystem is read-only.
    for name in consumers:
        assert image.docker("exec", name, "id", "-u").stdout.strip() == "10001"
        touch = image.docker("exec", name, "touch", "/opt/jobq/x", check=False)
        assert touch.returncode != 0 and "Read-only" in touch.stderr

    publish = containers.run(["publish"], "publish", "sleep", json.dumps({"seconds": SLEEP_S}),
                             detach=False)
    assert publish.returncode == 0, publish.stderr
    ids = [uuid.UUID(publish.stdout.strip())]
    for _ in range(JOBS - 1):
        ids.append(uuid.UUID(containers.run(["publish"], "publish", "sleep",
                                            json.dumps({"seconds": SLEEP_S}),
                                            detach=False).stdout.strip()))
    wait_until(lambda: sum(len(v) for v in _holders(db, ids).values()) == JOBS, 30,
               "all jobs running")
    holders = _holders(db, ids)
    victim_worker = max(holders, key=lambda w: len(holders[w]))
    victim = next(n for n in consumers if f"worker={victim_worker}" in containers.logs(n))
    held = holders[victim_worker]
    image.docker("kill", victim)  # SIGKILL of the container
    killed_at = db.val("SELECT now()")
    wait_until(lambda: all(db.val("SELECT attempts FROM jobq.job WHERE id = $1", j) == 2
                           for j in held), 20, "the killed container's jobs running again")
    again = [db.val("SELECT extract(epoch FROM started_at - $2::timestamptz)::float8 "
                    "FROM jobq.job WHERE id = $1", j, killed_at) for j in held]
    print(f"\n{len(held)} job(s) of the killed container running again after "
          f"max {max(again):.2f} s (all: {sorted(round(a, 2) for a in again)})")
    assert max(again) <= 3.0, again
    assert db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND status = 'active'",
                  ids) == JOBS  # nothing lost: all running in the other container

    survivor = next(n for n in consumers if n != victim)
    stalls_before = db.val("SELECT sum(stalls) FROM jobq.job WHERE id = ANY($1)", ids)
    image.docker("stop", "--time", "20", survivor)  # SIGTERM: drain, release
    assert image.docker("inspect", "--format", "{{.State.ExitCode}}", survivor
                        ).stdout.strip() == "0"
    assert db.val("SELECT count(*) FROM jobq.job WHERE id = ANY($1) AND status = 'queued'",
                  ids) == JOBS
    assert db.val("SELECT sum(stalls) FROM jobq.job WHERE id = ANY($1)", ids) == stalls_before
    assert "released" in containers.logs(survivor)


def test_a_wrong_login_exits_2_with_one_line(containers: Containers,
                                              env: dict[str, str]) -> None:
    parts = urlsplit(env["JOBQ_DATABASE_URL"])
    url = urlunsplit(parts._replace(netloc=f"nosuchuser:wrong@{parts.hostname}:{parts.port}"))
    for verb in ("reap", "consume"):
        args = ["consume", "jobq.demo:app"] if verb == "consume" else ["reap"]
        out = containers.run([verb], *args, detach=False, JOBQ_DATABASE_URL=url)
        lines = (out.stdout + out.stderr).strip().splitlines()
        assert out.returncode == 2, (out.returncode, lines)
        assert len(lines) == 1 and lines[0].startswith("jobq: error: "), lines
        assert "wrong" not in lines[0]  # no password in any output
