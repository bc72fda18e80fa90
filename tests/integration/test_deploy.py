"""deploy/ without Docker: compose.yaml and the Kubernetes manifests validate
against their schemas, the RabbitMQ definitions match what jobq declares, and
the exact commands and environment compose.yaml gives each service run as
local processes against the test PostgreSQL and RabbitMQ."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from harness.helpers import Proc, Procs, SyncDB, free_port, http, wait_until
from jobq.amqp.broker import queue_arguments
from jobq.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return loaded


def test_compose_file_matches_the_compose_spec() -> None:
    out = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                          "vendor.compose-spec", str(ROOT / "compose.yaml")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    services = compose()["services"]
    assert {"postgres", "rabbitmq", "migrate", "consumer", "reaper", "producer"} <= set(services)
    assert services["consumer"]["deploy"]["replicas"] == 3
    assert services["reaper"]["deploy"]["replicas"] == 2
    for name in ("postgres", "rabbitmq", "consumer", "reaper"):
        assert "healthcheck" in services[name], name
    assert services["consumer"]["depends_on"]["migrate"]["condition"] == \
        "service_completed_successfully"


@pytest.mark.parametrize("path", sorted((ROOT / "deploy" / "k8s").glob("**/*.yaml")),
                         ids=lambda p: p.name)
def test_kubernetes_manifests_are_valid(path: Path) -> None:
    if path.name == "kustomization.yaml":
        listed = yaml.safe_load(path.read_text())["resources"]
        assert sorted(listed) == sorted(p.name for p in path.parent.glob("*.yaml")
                                        if p.name != "kustomization.yaml")
        return
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, "1.30.0", strict=True)


def _workloads() -> list[dict[str, Any]]:
    return [yaml.safe_load((ROOT / "deploy/k8s" / f).read_text())
            for f in ("consumer.yaml", "reaper.yaml", "migrate-job.yaml")]


def test_kubernetes_services_run_least_privileged() -> None:
    """Issue #14: own secret per service (the migrate Job's alone has DDL
    rights), no secret in the kustomization, locked-down containers, and
    ingress on the health/metrics port only."""
    k8s = ROOT / "deploy/k8s"
    listed = yaml.safe_load((k8s / "kustomization.yaml").read_text())["resources"]
    for name in listed:
        for doc in yaml.safe_load_all((k8s / name).read_text()):
            assert doc["kind"] != "Secret", name
            assert "stringData" not in doc and "password" not in json.dumps(doc).lower(), name
    secrets = set()
    for w in _workloads():
        pod = w["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}
            (ref,) = [e["secretRef"]["name"] for e in c["envFrom"] if "secretRef" in e]
            secrets.add(ref)
    assert secrets == {"jobq-consumer", "jobq-reaper", "jobq-migrate"}
    examples = {d["metadata"]["name"] for d in
                yaml.safe_load_all((k8s / "examples/secrets.yaml").read_text())}
    assert examples == secrets
    policy = yaml.safe_load((k8s / "networkpolicy.yaml").read_text())["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8000}]}]


def test_compose_services_log_in_as_their_own_roles() -> None:
    from urllib.parse import urlsplit

    services = compose()["services"]
    users = {}
    for name in ("migrate", "consumer", "reaper", "producer"):
        e = services[name]["environment"]
        db, amqp = urlsplit(e["JOBQ_DATABASE_URL"]), urlsplit(e["JOBQ_AMQP_URL"])
        users[name] = (db.username, amqp.username)
        assert db.username != "postgres" and amqp.username not in ("guest", "jobq-admin")
    assert len({u for u, _ in users.values()}) == 4 and len({a for _, a in users.values()}) == 4
    assert services["rabbitmq"]["ports"] == ["127.0.0.1:15672:15672"]
    dash = services["dashboard"]
    assert urlsplit(dash["environment"]["JOBQ_DATABASE_URL"]).username == "app_reader"
    assert dash["ports"] == ["127.0.0.1:8080:8080"] and "--allow-actions" not in dash["command"]
    init = (ROOT / "deploy/postgres/init-roles.sh").read_text()
    for name, (db_user, _) in users.items():
        group = "jobq_owner" if name == "migrate" else f"jobq_{name}"
        assert f"CREATE ROLE {db_user} LOGIN PASSWORD :'{name}_pw' IN ROLE {group};" in init
    d = json.loads((ROOT / "deploy/rabbitmq/definitions.json").read_text())
    tags = {u["name"]: u["tags"] for u in d["users"]}
    perms = {p["user"]: p for p in d["permissions"]}
    for name, (_, amqp_user) in users.items():
        assert tags[amqp_user] == [], amqp_user
        if name != "migrate":  # runtime users declare nothing
            assert perms[amqp_user]["configure"] == "^$", amqp_user


def test_consumer_grace_outlasts_its_drain() -> None:
    consumer = yaml.safe_load((ROOT / "deploy/k8s/consumer.yaml").read_text())
    config = yaml.safe_load((ROOT / "deploy/k8s/configmap.yaml").read_text())["data"]
    spec = consumer["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > float(config["JOBQ_CONSUMER__SHUTDOWN_GRACE_S"])
    probes = spec["containers"][0]
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    svc = compose()["services"]["consumer"]
    assert float(svc["stop_grace_period"].rstrip("s")) > float(
        svc["environment"]["JOBQ_CONSUMER__SHUTDOWN_GRACE_S"])


def test_image_is_small_non_root_and_pinned() -> None:
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    stages = [ln for ln in dockerfile.splitlines() if ln.startswith("FROM ")]
    assert len(stages) == 2, "build stage + slim runtime stage"
    runtime = dockerfile[dockerfile.rindex(stages[1]):]
    assert "USER jobq" in runtime and 'ENTRYPOINT ["jobq"]' in runtime
    assert "pip wheel" not in runtime and "gcc" not in runtime
    lock = [ln for ln in (ROOT / "deploy/requirements.lock").read_text().splitlines()
            if ln and not ln.startswith("#")]
    assert lock and all("==" in ln for ln in lock)
    names = {ln.split("==")[0].lower().replace("_", "-") for ln in lock}
    assert {"aio-pika", "asyncpg", "pydantic", "pydantic-settings"} <= names


def test_rabbitmq_definitions_match_what_jobq_declares() -> None:
    d = json.loads((ROOT / "deploy/rabbitmq/definitions.json").read_text())
    queues = {q["name"]: q for q in d["queues"]}
    for q in ("echo", "sleep", "flaky", "crash"):
        assert queues[f"jobq.{q}"]["arguments"] == queue_arguments("jobq")
        assert queues[f"jobq.{q}"]["durable"]
    assert queues["jobq.dead"]["arguments"] == {}
    exchanges = {e["name"]: e["type"] for e in d["exchanges"]}
    assert exchanges == {"jobq": "direct", "jobq.dlx": "fanout"}
    conf = (ROOT / "deploy/rabbitmq/rabbitmq.conf").read_text()
    assert "definitions.local.path = /etc/rabbitmq/definitions.json" in conf


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    status, body = http(f"http://127.0.0.1:{port}{path}")
    return status, json.loads(body)


def _service_argv(svc: dict[str, Any]) -> list[str]:
    entry = svc.get("entrypoint", ["jobq"])
    prefix = [sys.executable, "-m", "jobq"] if entry == ["jobq"] else [sys.executable, *entry[1:]]
    return prefix + list(svc.get("command", []))


def test_compose_services_run_as_local_processes(settings: Settings, db: SyncDB,
                                                 env: dict[str, str], tmp_path: Path) -> None:
    """The commands and environment of compose.yaml, with only the service
    addresses swapped for the test ones: jobs flow, health answers, and
    SIGTERM drains within the stop grace period."""
    services = compose()["services"]

    def service_env(name: str, port: int) -> dict[str, str]:
        e = {**env, **{k: str(v) for k, v in services[name]["environment"].items()}}
        # Each service as the test login of its own role (migrate as owner).
        role = {"migrate": "ADMIN"}.get(name, name.upper())
        e.update(JOBQ_DATABASE_URL=env[f"JOBQ_TEST_LOGIN_{role}"],
                 JOBQ_AMQP_URL=env.get(f"JOBQ_TEST_BROKER_{role}", settings.amqp_url),
                 JOBQ_NAMESPACE=settings.namespace, JOBQ_HEALTH_PORT=str(port))
        return e

    def start(name: str, i: int = 0) -> tuple[Proc, int]:
        port = free_port()
        argv = _service_argv(services[name])
        return Proc(f"{name}{i}", argv[1:], service_env(name, port), tmp_path, raw=True), port

    migrate, _ = start("migrate")
    assert migrate.wait(30) == 0, migrate.log()
    migrate.close()
    started = [start("consumer", i) for i in range(services["consumer"]["deploy"]["replicas"])]
    started += [start("reaper", i) for i in range(services["reaper"]["deploy"]["replicas"])]
    producer = None
    try:
        for proc, port in started:
            wait_until(lambda: _get_quiet(port, "/readyz") == 200, 20, f"{proc.name} ready")
            assert _get(port, "/healthz")[0] == 200
        # Only now the demo producer: its crash jobs kill a consumer (once,
        # on purpose), which must not race the readiness checks above.
        producer, _ = start("producer")
        try:
            wait_until(lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'")
                       >= 10, 30, "demo jobs to flow")
        except AssertionError as exc:  # what each side saw, for the next reader (CI, once)
            states = db.fetch("SELECT status, count(*) FROM jobq.job GROUP BY 1")
            logs = "\n".join(f"--- {p.name}:\n{p.log()[-1500:]}"
                              for p in [producer, *(q for q, _ in started)])
            raise AssertionError(f"{exc}; jobs: {[dict(r) for r in states]}\n{logs}") from None
        grace = float(services["consumer"]["stop_grace_period"].rstrip("s"))
        consumers = [p for p, _ in started if p.name.startswith("consumer")]
        for p in consumers:
            p.signal(signal.SIGTERM)
        t0 = time.monotonic()
        for p in consumers:
            code = p.wait(grace + 5)
            # -9: the demo's "crash" job killed it on purpose (compose restarts it)
            assert code in (0, -signal.SIGKILL), p.log()[-2000:]
        assert time.monotonic() - t0 < grace
    finally:
        if producer is not None:
            producer.close()
        for p, _ in started:
            p.close()


def _get_quiet(port: int, path: str) -> int:
    try:
        return _get(port, path)[0]
    except OSError:
        return 0


def test_readyz_reflects_a_database_outage(settings: Settings, procs: Procs) -> None:
    from urllib.parse import urlsplit

    from harness.helpers import TcpProxy

    u = urlsplit(settings.database_url)
    proxy = TcpProxy(u.hostname or "127.0.0.1", u.port or 5432)
    proxy.restore()
    port = free_port()
    try:
        c = procs.consumer(JOBQ_DATABASE_URL=proxy.url(settings.database_url),
                           JOBQ_HEALTH_PORT=str(port))
        c.worker_id()
        assert _get(port, "/readyz") == (200, {"ready": True, "database": True, "broker": True,
                                               "accepting": True})
        proxy.cut()
        # readiness is computed at most once a second: wait for the next one
        wait_until(lambda: _get_quiet(port, "/readyz") == 503, 5, "not ready")
        status, body = _get(port, "/readyz")
        assert status == 503 and body["database"] is False
        assert _get(port, "/healthz")[0] == 200  # alive, just not ready
        proxy.restore()
        wait_until(lambda: _get_quiet(port, "/readyz") == 200, 15, "ready again")
    finally:
        proxy.close()


def test_grafana_dashboard_uses_only_metrics_jobq_exports() -> None:
    import re

    from jobq.telemetry import metrics

    dash = json.loads((ROOT / "deploy/grafana/jobq-dashboard.json").read_text())
    exported = set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    for family in metrics.REGISTRY.collect():
        exported |= {family.name + sfx for sfx in suffixes[family.type]}
    used = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\bjobq_[a-z_]+", target["expr"]))
    assert used and used <= exported, used - exported


def test_compose_variables_are_not_taken_for_jobq_settings() -> None:
    """Issue #33: compose.yaml told users to set JOBQ_*_DB_PASSWORD, and then
    every `jobq` command in that shell refused to run (an unknown JOBQ_
    setting). The variables a user sets for compose must not look like jobq's."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "compose.yaml").read_text()
    wanted = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    assert wanted and not {v for v in wanted if v.startswith("JOBQ_")}, wanted


def test_compose_file_is_read_by_a_real_compose() -> None:
    """Issue #35: not only the schema: Debian's docker-compose (1.29) reads it
    (`config` resolves every variable, anchor and dependency)."""
    import shutil
    import subprocess
    from pathlib import Path

    import pytest

    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("no docker-compose: install Debian's docker-compose (.ci/run does)")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([tool, "-f", str(root / "compose.yaml"), "config", "-q"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
