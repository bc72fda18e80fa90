"""Scratch databases and AMQP namespaces: created for one test or benchmark
run, removed afterwards, so runs never see each other."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit, urlunsplit

import asyncpg

TEST_RUN_DDL = """
CREATE TABLE public.test_run (
    n          bigserial PRIMARY KEY,
    job_id     uuid NOT NULL,
    worker     text NOT NULL,
    attempt    integer NOT NULL,
    lock       uuid NOT NULL,
    pid        integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at   timestamptz,
    outcome    text  -- NULL while running (or killed), 'returned', 'cancelled'
);
-- an external side effect of durable steps (harness/apps.py: steps)
CREATE TABLE public.test_counter (name text PRIMARY KEY, n integer NOT NULL)"""


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def with_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


async def admin(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for s in statements:
            await conn.execute(s)
    finally:
        await conn.close()


async def delete_namespace(amqp_url: str, namespace: str, queues: list[str]) -> None:
    import aio_pika

    conn = await aio_pika.connect(amqp_url)
    try:
        for q in [f"{namespace}.{x}" for x in queues] + [f"{namespace}.dead"]:
            ch = await conn.channel()
            try:
                await ch.queue_delete(q)
            except Exception:
                pass
        for ex in (namespace, f"{namespace}.dlx"):
            ch = await conn.channel()
            try:
                await ch.exchange_delete(ex)
            except Exception:
                pass
    finally:
        await conn.close()


async def delete_namespace_of(db_url: str, amqp_url: str, namespace: str,
                              fallback: list[str]) -> None:
    """Delete the broker queues of every queue ``jobq.queue`` of ``db_url``
    names (``fallback`` if it cannot be read), and the namespace's
    exchanges. Stop the namespace's consumers first: a robust consumer
    declares its queue again."""
    try:
        conn = await asyncpg.connect(db_url)
        try:
            names = [r["name"] for r in await conn.fetch("SELECT name FROM jobq.queue")]
        finally:
            await conn.close()
    except Exception:
        names = fallback
    await delete_namespace(amqp_url, namespace, names)


def login_url(url: str, user: str, password: str) -> str:
    """``url`` with another user and password."""
    from urllib.parse import quote

    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(user)}:{quote(password)}@{host}"))


class Logins:
    """Login roles of one test run, one per jobq group role (producer,
    consumer, reaper, reader), as a deployment would create them; dropped
    at the end of the run. Roles are cluster-wide: the run id keeps runs
    apart."""

    GROUPS = ("producer", "consumer", "reaper", "reader")

    def __init__(self, admin_url: str, run: str) -> None:
        import secrets

        self.admin_url = admin_url
        self.prefix = f"jq{run}_"
        self.password = secrets.token_hex(12)
        self.made: list[str] = []

    def create(self, name: str, *groups: str) -> tuple[str, str]:
        import asyncio

        user = self.prefix + name
        grant = [f"GRANT {', '.join(groups)} TO {user}"] if groups else []
        asyncio.run(admin(self.admin_url,
                          f"CREATE ROLE {user} LOGIN PASSWORD '{self.password}'", *grant))
        self.made.append(user)
        return user, self.password

    def setup(self) -> None:
        for g in self.GROUPS:
            self.create(g, f"jobq_{g}")

    def url(self, group: str, db_url: str) -> str:
        return login_url(db_url, self.prefix + group, self.password)

    def drop(self) -> None:
        import asyncio

        async def go() -> None:
            conn = await asyncpg.connect(self.admin_url)
            try:
                for user in self.made:
                    await conn.execute(f"DROP ROLE IF EXISTS {user}")
            finally:
                await conn.close()

        asyncio.run(go())


def _rabbit_hash(password: str) -> str:
    import base64
    import hashlib
    import os

    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


class BrokerLogins:
    """RabbitMQ users of one test run, one per jobq service, with rights on
    the run's namespaces only (``^<prefix>``); made and removed with
    rabbitmqctl, so only where the broker runs on this machine. ``configure``
    False: the users may declare nothing (topology declared beforehand)."""

    def __init__(self, amqp_url: str, run: str, prefix: str, configure: bool = True,
                 tag: str = "") -> None:
        import secrets

        self.amqp_url = amqp_url
        self.prefix = prefix
        self.names = {g: f"jq{run}{tag}-{g}" for g in Logins.GROUPS if g != "reader"}
        self.password = secrets.token_hex(12)
        self.configure = configure
        self.made = False

    @staticmethod
    def available(amqp_url: str) -> bool:
        import shutil

        host = urlsplit(amqp_url).hostname
        return bool(shutil.which("rabbitmqctl")) and host in ("127.0.0.1", "localhost")

    def _perms(self, group: str) -> dict[str, str]:
        ns = f"^{self.prefix}"
        if self.configure:  # its own user, rights on the run's names only
            return {"configure": ns, "write": ns, "read": ns}
        exchange = f"^{self.prefix}[^.]*$"  # publish ids; never declare
        read = f"^{self.prefix}[^.]*\\." if group == "consumer" else "^$"
        return {"configure": "^$", "write": exchange, "read": read}

    def setup(self) -> None:
        import json
        import os
        import subprocess
        import tempfile

        vhost = urlsplit(self.amqp_url).path.lstrip("/") or "/"
        defs = {"users": [{"name": n, "password_hash": _rabbit_hash(self.password),
                           "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}
                          for n in self.names.values()],
                "permissions": [{"user": n, "vhost": vhost, **self._perms(g)}
                                for g, n in self.names.items()]}
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(defs, f)
            f.flush()
            os.chmod(f.name, 0o644)  # rabbitmqctl reads it as the rabbitmq user
            subprocess.run(["rabbitmqctl", "import_definitions", f.name], check=True,
                           capture_output=True, timeout=60)
        self.made = True
        # The import finishes asynchronously: wait until the last user exists.
        last = list(self.names.values())[-1]
        for _ in range(100):
            out = subprocess.run(["rabbitmqctl", "list_user_permissions", "-q", last],
                                 capture_output=True, timeout=60)
            if out.returncode == 0:
                return
        raise RuntimeError(f"RabbitMQ did not create the test users ({out.stderr!r})")

    def url(self, group: str) -> str:
        return login_url(self.amqp_url, self.names[group], self.password)

    def drop(self) -> None:
        import subprocess

        if not self.made:
            return
        procs = [subprocess.Popen(["rabbitmqctl", "delete_user", n], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for n in self.names.values()]
        for p in procs:
            p.wait(60)
