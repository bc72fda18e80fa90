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
)"""


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
