"""Private TLS servers for tests (issue #14): a throwaway CA, a PostgreSQL
cluster with ``ssl = on`` that refuses plaintext, and a RabbitMQ node with
only a TLS listener, each on its own ports and data directory, started and
removed by the fixture, never the shared services.

Certificates come from ``openssl`` (Debian's, always present with
PostgreSQL). The server certificate names ``localhost`` only, so a client
that connects to ``127.0.0.1`` and checks the name must refuse it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harness.helpers import free_port, wait_until


def _run(*argv: str, user: str | None = None, env: dict[str, str] | None = None) -> str:
    if user and os.geteuid() == 0:
        argv = ("runuser", "-u", user, "--", *argv)
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {out.stdout}{out.stderr}")
    return out.stdout


@dataclass
class CA:
    """A CA and one server certificate it signed (for DNS name localhost)."""

    dir: Path

    @property
    def cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def server_cert(self) -> Path:
        return self.dir / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "server.key"

    @classmethod
    def make(cls, where: Path, name: str = "jobq test CA") -> CA:
        where.mkdir(parents=True, exist_ok=True)
        ca = cls(where)
        _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", str(where / "ca.key"), "-out", str(ca.cert))
        _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
             "-keyout", str(ca.server_key), "-out", str(where / "server.csr"))
        ext = where / "san.ext"
        ext.write_text("subjectAltName = DNS:localhost\n")
        _run("openssl", "x509", "-req", "-in", str(where / "server.csr"), "-CA", str(ca.cert),
             "-CAkey", str(where / "ca.key"), "-CAcreateserial", "-days", "2",
             "-extfile", str(ext), "-out", str(ca.server_cert))
        for p in where.iterdir():
            p.chmod(0o644)
        ca.server_key.chmod(0o600)
        return ca


def _pg_bin() -> Path:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                      key=lambda p: int(p.parent.parent.name))
    if not versions:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    return versions[-1].parent


def _own_dir(prefix: str, user: str) -> Path:
    """A fresh directory under /tmp that ``user`` owns: servers started as
    root switch to their own user (postgres, rabbitmq), which cannot enter
    pytest's private tmp_path."""
    import tempfile

    where = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(where, user, user)
    return where


def _give(path: Path, user: str) -> None:
    if os.geteuid() == 0:
        for p in (path, *path.rglob("*")):
            shutil.chown(p, user, user)


class TlsPostgres:
    """initdb + pg_ctl on a free port; TLS only (hostssl), trust auth."""

    def __init__(self, ca: CA) -> None:
        self.port = free_port()
        self.bin = _pg_bin()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        where = self.dir = _own_dir("jobq-tls-pg-", self.user)
        self.data = where / "data"
        certs = where / "certs"
        certs.mkdir()
        for f in (ca.server_cert, ca.server_key):
            shutil.copy(f, certs / f.name)
        _give(certs, self.user)
        self.certs = certs

    def start(self) -> None:
        _run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
             "--no-sync", user=self.user)
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n"
            "host all all 0.0.0.0/0 reject\nhost all all ::/0 reject\n")
        opts = (f"-p {self.port} -c listen_addresses=localhost"
                f" -c unix_socket_directories={self.dir}"
                f" -c ssl=on -c ssl_cert_file={self.certs}/server.crt"
                f" -c ssl_key_file={self.certs}/server.key -c fsync=off -c max_connections=100")
        _run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l",
             str(self.dir / "log"), "-w", "start", user=self.user)

    def url(self, db: str = "postgres", host: str = "localhost", ca: Path | None = None) -> str:
        return (f"postgresql://postgres@{host}:{self.port}/{db}"
                f"?sslmode=verify-full&sslrootcert={ca}")

    def stop(self) -> None:
        try:
            _run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop",
                 user=self.user)
        except RuntimeError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


class TlsRabbit:
    """A second RabbitMQ node on this machine: its own node name, data and
    log directories, a TLS listener and no plaintext one."""

    def __init__(self, ca: CA) -> None:
        user = "rabbitmq" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        where = self.dir = _own_dir("jobq-tls-rabbit-", user)
        self.port = free_port()
        self.node = f"jobqtls{os.getpid()}@localhost"
        for f in (ca.cert, ca.server_cert, ca.server_key):
            shutil.copy(f, where / f.name)
        conf = where / "rabbitmq.conf"
        conf.write_text(
            "listeners.tcp = none\n"
            f"listeners.ssl.default = {self.port}\n"
            f"ssl_options.cacertfile = {where / 'ca.crt'}\n"
            f"ssl_options.certfile = {where / 'server.crt'}\n"
            f"ssl_options.keyfile = {where / 'server.key'}\n"
            "ssl_options.verify = verify_peer\n"
            "ssl_options.fail_if_no_peer_cert = false\n"
            "loopback_users = none\n")
        (where / "enabled_plugins").write_text("[].\n")
        _give(where, user)
        self.env = {**os.environ,
                    "RABBITMQ_NODENAME": self.node,
                    "RABBITMQ_CONFIG_FILE": str(conf),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": str(where / "enabled_plugins"),
                    "RABBITMQ_MNESIA_BASE": str(where / "mnesia"),
                    "RABBITMQ_LOG_BASE": str(where / "log"),
                    "RABBITMQ_DIST_PORT": str(free_port()),
                    "RABBITMQ_PID_FILE": str(where / "pid")}

    def start(self) -> None:
        from harness.scratch import reachable

        if not shutil.which("rabbitmq-server"):
            raise RuntimeError("rabbitmq-server is not installed")
        subprocess.run(["rabbitmq-server", "-detached"], env=self.env, check=True,
                       capture_output=True, timeout=60)
        # -detached returns before the node is registered; await_startup
        # fails on a node it cannot find yet, so wait for the port first.
        wait_until(lambda: reachable("127.0.0.1", self.port), 60,
                   f"the TLS listener of {self.node}", interval=0.2)
        _run("rabbitmqctl", "-n", self.node, "--timeout", "60", "await_startup", env=self.env)

    def url(self, host: str = "localhost", ca: Path | None = None) -> str:
        return f"amqps://guest:guest@{host}:{self.port}/?cafile={ca}"

    def stop(self) -> None:
        import signal

        try:
            _run("rabbitmqctl", "-n", self.node, "stop", env=self.env)
        except RuntimeError:
            pid = self.dir / "pid"
            if pid.exists():  # not answering: end it anyway
                try:
                    os.kill(int(pid.read_text().strip()), signal.SIGKILL)
                except (ValueError, OSError):
                    pass
        time.sleep(0.2)
        shutil.rmtree(self.dir, ignore_errors=True)
