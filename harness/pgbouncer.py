"""PgBouncer in transaction pooling mode in front of the shared PostgreSQL
(issue #15): Debian's pgbouncer, its own port, config and log under /tmp,
run as the postgres user (it refuses root). Consecutive transactions of
one client may run on different server sessions, so anything that relies
on session state (named prepared statements, session advisory locks,
LISTEN, settings sent at login) breaks through it, as in production."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from urllib.parse import urlsplit, urlunsplit

from harness.helpers import free_port, wait_until
from harness.scratch import reachable
from harness.tls import _own_dir


class PgBouncer:
    def __init__(self, server_url: str, users: tuple[str, ...] = ("postgres",)) -> None:
        exe = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.path.exists(exe):
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.exe = exe
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.dir = _own_dir("jobq-pgbouncer-", self.user)
        self.port = free_port()
        u = urlsplit(server_url)
        (self.dir / "users.txt").write_text("".join(f'"{name}" ""\n' for name in users))
        self.ini = self.dir / "pgbouncer.ini"
        login = f" user={u.username} password={u.password}" if u.password else ""
        self.ini.write_text(
            "[databases]\n"  # PgBouncer logs in to the server as the server URL says
            f"* = host={u.hostname or '127.0.0.1'} port={u.port or 5432}{login}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'users.txt'}\n"
            "pool_mode = transaction\ndefault_pool_size = 10\nmax_client_conn = 1000\n"
            f"logfile = {self.dir / 'log'}\npidfile = {self.dir / 'pid'}\n"
            "server_reset_query =\nadmin_users = postgres\n")
        if os.geteuid() == 0:
            for p in (self.dir, *self.dir.iterdir()):
                shutil.chown(p, self.user, self.user)

    def start(self) -> None:
        argv = [self.exe, "-d", str(self.ini)]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", self.user, "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
        wait_until(lambda: reachable("127.0.0.1", self.port), 15, "pgbouncer listening",
                   interval=0.1)

    def url(self, direct_url: str) -> str:
        """``direct_url`` with PgBouncer's host and port."""
        u = urlsplit(direct_url)
        auth = u.netloc.rpartition("@")[0]
        return urlunsplit(u._replace(netloc=f"{auth + '@' if auth else ''}127.0.0.1:{self.port}"))

    def clients(self) -> list[dict[str, str]]:
        """The client connections PgBouncer holds now (its admin console's
        SHOW CLIENTS, through psql: the console speaks the simple protocol only)."""
        out = subprocess.run(
            ["psql", f"host=127.0.0.1 port={self.port} dbname=pgbouncer user=postgres",
             "-A", "-F", "\t", "-P", "footer=off", "-c", "SHOW CLIENTS"],
            check=True, capture_output=True, text=True, timeout=10).stdout.splitlines()
        head = out[0].split("\t")
        return [dict(zip(head, line.split("\t"))) for line in out[1:]]

    def log(self) -> str:
        try:
            return (self.dir / "log").read_text()
        except OSError:
            return ""

    def close(self) -> None:
        try:
            os.kill(int((self.dir / "pid").read_text().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)



