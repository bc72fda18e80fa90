"""A PostgreSQL server of a benchmark's own (issue #49): own port and data
directory under /tmp, ``pg_stat_statements`` loaded, and optionally held to a
CPU quota, so that the database is the scarce resource and what each system
asks of it is counted where it happens.

The quota is a cgroup's: cgroup v2 ``cpu.max`` where the unified hierarchy
has the cpu controller, else cgroup v1 ``cpu.cfs_quota_us`` (this machine's).
The postmaster and every process it has forked are moved into the group;
backends forked later inherit it. Needs root (a container's root is enough
where /sys/fs/cgroup is writable). ``close()`` stops the server, removes the
group and the directory.

    with OwnServer(cpus=0.5) as pg:
        url = pg.admin_url()            # postgresql://postgres@127.0.0.1:PORT/postgres
        pg.statements()                 # pg_stat_statements, per query
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from harness.helpers import free_port
from harness.pg_pair import _as
from harness.tls import _own_dir, _pg_bin

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


class OwnServer:
    def __init__(self, cpus: float | None = None, max_connections: int = 200) -> None:
        self.bin = _pg_bin()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.dir = _own_dir("jobq-pg-own-", self.user)
        self.data = self.dir / "data"
        self.port = free_port()
        self.cpus = cpus
        self.max_connections = max_connections
        self.group: Path | None = None

    def __enter__(self) -> OwnServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        _as(self.user, str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
            "-A", "trust", "--no-sync")
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1"
                f" -c unix_socket_directories={self.dir}"
                f" -c max_connections={self.max_connections}"
                " -c shared_preload_libraries=pg_stat_statements"
                " -c pg_stat_statements.track=all -c pg_stat_statements.max=5000"
                " -c shared_buffers=256MB -c track_io_timing=on")
        _as(self.user, str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts,
            "-l", str(self.dir / "server.log"), "-w", "start")
        self._sql("postgres", "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self._sql("template1", "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if self.cpus is not None:
            self.cap(self.cpus)

    def admin_url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def _sql(self, db: str, sql: str) -> Any:
        async def go() -> Any:
            conn = await asyncpg.connect(self.admin_url(db))
            try:
                return await conn.fetch(sql)
            finally:
                await conn.close()

        return asyncio.run(go())

    # ── the CPU quota ──

    def _pids(self) -> list[int]:
        """The postmaster and everything under it."""
        with open(self.data / "postmaster.pid") as f:
            root = int(f.readline())
        out, todo = [], [root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            try:
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children") as f:
                        todo += [int(c) for c in f.read().split()]
            except OSError:
                continue
        return out

    def cap(self, cpus: float) -> str:
        """Hold the server to ``cpus`` CPUs; which mechanism, said."""
        name = f"jobq-pg-{uuid.uuid4().hex[:8]}"
        v2 = CGROUP_V2 / "cgroup.controllers"
        if v2.exists() and "cpu" in v2.read_text().split():
            self.group = CGROUP_V2 / name
            self.group.mkdir()
            (self.group / "cpu.max").write_text(f"{int(cpus * 100_000)} 100000")
            how = f"cgroup v2 cpu.max {int(cpus * 100_000)} 100000"
        else:
            self.group = CGROUP_V1 / name
            self.group.mkdir()
            (self.group / "cpu.cfs_period_us").write_text("100000")
            (self.group / "cpu.cfs_quota_us").write_text(str(int(cpus * 100_000)))
            how = f"cgroup v1 cpu.cfs_quota_us {int(cpus * 100_000)} / 100000 us"
        for pid in self._pids():
            try:
                (self.group / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass  # gone meanwhile
        return how

    def throttled_s(self) -> float:
        """Seconds the group was held back by its quota so far."""
        if self.group is None:
            return 0.0
        stat = (self.group / "cpu.stat").read_text().split()
        kv = dict(zip(stat[::2], stat[1::2]))
        if "throttled_usec" in kv:
            return int(kv["throttled_usec"]) / 1e6
        return int(kv.get("throttled_time", 0)) / 1e9

    # ── what the server did ──

    def database_stats(self, db: str) -> dict[str, int]:
        """pg_stat_database's counters of ``db`` (tuples and buffers)."""
        (row,) = self._sql(db, "SELECT tup_fetched, tup_returned, tup_inserted, tup_updated, "
                               "tup_deleted, blks_hit, blks_read, xact_commit FROM "
                               "pg_stat_database WHERE datname = current_database()")
        return dict(row)

    def relation_stats(self, db: str) -> dict[str, int]:
        """Per table and index: rows read by sequential scans, index entries
        read (where the tuples each system reads come from)."""
        rows = self._sql(db, "SELECT 'seq ' || relname AS what, seq_tup_read AS n "
                             "FROM pg_stat_user_tables UNION ALL "
                             "SELECT 'idx ' || indexrelname, idx_tup_read "
                             "FROM pg_stat_user_indexes")
        return {r["what"]: int(r["n"] or 0) for r in rows}

    def statements(self, db: str) -> list[dict[str, Any]]:
        """pg_stat_statements of ``db``, by total time."""
        return [dict(r) for r in self._sql(
            db, "SELECT s.query, s.calls, s.rows, s.total_exec_time, s.shared_blks_hit, "
                "s.shared_blks_read FROM pg_stat_statements s JOIN pg_database d "
                "ON d.oid = s.dbid WHERE d.datname = current_database() "
                "ORDER BY s.total_exec_time DESC")]

    def reset_statements(self, db: str) -> None:
        self._sql(db, "SELECT pg_stat_statements_reset(), pg_stat_reset()")

    def close(self) -> None:
        try:
            _as(self.user, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                "stop")
        except RuntimeError:
            pass
        if self.group is not None:
            try:
                self.group.rmdir()
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
