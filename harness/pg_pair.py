"""A PostgreSQL primary and hot standby on this machine (issue #15).

Own ports and data directories under /tmp (owned by the postgres user when
run as root): ``initdb`` for the primary, ``pg_basebackup -R`` for the
standby, streaming replication, synchronous (``synchronous_standby_names``
names the standby: a commit returns once the standby has flushed it) or
asynchronous. ``url()`` lists both hosts with
``target_session_attrs=read-write``, as the services are told to connect.
``crash_primary()`` stops the primary as a crash would (immediate, no
checkpoint, connections cut); ``promote()`` makes the standby the primary;
``hold_replication()`` and ``drop_held()`` make a standby that lacks the
last transactions the primary committed (an asynchronous one's risk).
``close()`` stops both and removes the directories.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import subprocess

import asyncpg

from harness.helpers import free_port, wait_until
from harness.scratch import TEST_RUN_DDL
from harness.tls import _own_dir, _pg_bin


def _as(user: str, *argv: str) -> str:
    if os.geteuid() == 0:
        argv = ("runuser", "-u", user, "--", *argv)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if out.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {out.stdout}{out.stderr}")
    return out.stdout


class Pair:
    def __init__(self, synchronous: bool = True) -> None:
        self.bin = _pg_bin()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.dir = _own_dir("jobq-pg-pair-", self.user)
        self.ports = [free_port(), free_port()]
        self.data = [self.dir / "primary", self.dir / "standby"]
        self.synchronous = synchronous

    def _ctl(self, i: int, *args: str) -> str:
        return _as(self.user, str(self.bin / "pg_ctl"), "-D", str(self.data[i]), *args)

    def _opts(self, i: int) -> str:
        return (f"-p {self.ports[i]} -c listen_addresses=127.0.0.1"
                f" -c unix_socket_directories={self.dir} -c max_connections=200"
                " -c wal_level=replica -c max_wal_senders=5 -c hot_standby=on"
                " -c wal_keep_size=256MB"
                # The primary waits for the standby's flush; the standby,
                # once promoted, has no standby of its own to wait for.
                + (" -c synchronous_standby_names=standby" if self.synchronous and i == 0
                   else ""))

    def start(self) -> None:
        _as(self.user, str(self.bin / "initdb"), "-D", str(self.data[0]), "-U", "postgres",
            "-A", "trust", "--no-sync")
        with open(self.data[0] / "pg_hba.conf", "a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")
        self._ctl(0, "-o", self._opts(0), "-l", str(self.dir / "primary.log"), "-w", "start")
        _as(self.user, str(self.bin / "pg_basebackup"), "-h", "127.0.0.1",
            "-p", str(self.ports[0]), "-U", "postgres", "-D", str(self.data[1]), "-R",
            "-c", "fast", "-X", "stream")
        with open(self.data[1] / "postgresql.auto.conf", "a") as f:
            f.write(f"primary_conninfo = 'host=127.0.0.1 port={self.ports[0]} user=postgres "
                    "application_name=standby'\n")
        self._ctl(1, "-o", self._opts(1), "-l", str(self.dir / "standby.log"), "-w", "start")
        wait_until(self._streaming, 30, "the standby streaming", interval=0.2)

    def _streaming(self) -> bool:
        async def go() -> bool:
            conn = await asyncpg.connect(self.admin_url(0))
            try:
                return bool(await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"))
            finally:
                await conn.close()

        return asyncio.run(go())

    def admin_url(self, i: int, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports[i]}/{db}"

    def url(self, db: str = "jobq") -> str:
        """Both hosts; a session only where it may write."""
        return (f"postgresql://postgres@127.0.0.1:{self.ports[0]},127.0.0.1:{self.ports[1]}"
                f"/{db}?target_session_attrs=read-write")

    def create_db(self, name: str = "jobq") -> str:
        """A migrated jobq database (and the tests' test_run table), on the primary."""
        from jobq.ops import migrate

        async def go() -> None:
            conn = await asyncpg.connect(self.admin_url(0))
            await conn.execute(f"CREATE DATABASE {name}")
            await conn.close()
            conn = await asyncpg.connect(self.admin_url(0, name))
            await migrate.apply(conn)
            await conn.execute(TEST_RUN_DDL)
            await conn.close()

        asyncio.run(go())
        return self.url(name)

    def hold_replication(self) -> int:
        """Freeze the standby's WAL receiver (SIGSTOP): from now on the
        standby falls behind, as an asynchronous one does under load or on a
        slow link. Returns its pid, for release_replication()."""
        async def go() -> int:
            conn = await asyncpg.connect(self.admin_url(1))
            try:
                return int(await conn.fetchval("SELECT pid FROM pg_stat_wal_receiver"))
            finally:
                await conn.close()

        pid = asyncio.run(go())
        os.kill(pid, signal.SIGSTOP)
        return pid

    def drop_held(self, pid: int) -> None:
        """End the frozen WAL receiver (SIGKILL) without letting it read what
        already sits in its socket: the standby keeps only what it had
        received, as when the primary's host is lost with its network. The
        standby's postmaster restarts its processes (crash recovery), then
        accepts connections again."""
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

        async def up() -> bool:
            try:
                conn = await asyncpg.connect(self.admin_url(1), timeout=2)
            except (OSError, asyncpg.PostgresError):
                return False
            await conn.close()
            return True

        wait_until(lambda: asyncio.run(up()), 30, "the standby back after its restart",
                   interval=0.2)

    def crash_primary(self) -> None:
        self._ctl(0, "-m", "immediate", "stop")

    def promote(self) -> None:
        self._ctl(1, "-w", "promote")

    def close(self) -> None:
        for i in (0, 1):
            try:
                self._ctl(i, "-m", "immediate", "stop")
            except RuntimeError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
