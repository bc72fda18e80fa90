"""The health server bounds what any client can cost (issue #13): an
oversized request line gets 400 (it was a traceback per request), idle
connections beyond the cap are closed, readiness is computed once a second."""

from __future__ import annotations

import asyncio

from jobq.runtime import health
from jobq.runtime.health import HealthServer


async def _request(port: int, line: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(line)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data


def test_an_oversized_request_line_gets_400_and_the_server_goes_on() -> None:
    async def go() -> tuple[bytes, bytes]:
        server = HealthServer("127.0.0.1", 0, lambda: True, _ready_ok)
        await server.start()
        try:
            big = await _request(server.port, b"GET /" + b"x" * 70_000 + b" HTTP/1.0\r\n\r\n")
            ok = await _request(server.port, b"GET /healthz HTTP/1.0\r\n\r\n")
        finally:
            await server.stop()
        return big, ok

    big, ok = asyncio.run(go())
    assert big.startswith(b"HTTP/1.0 400")
    assert ok.startswith(b"HTTP/1.0 200")


async def _ready_ok() -> dict[str, bool | str]:
    return {"database": True}


def test_connections_over_the_cap_are_closed_at_once() -> None:
    async def go() -> tuple[int, bytes]:
        server = HealthServer("127.0.0.1", 0, lambda: True, _ready_ok)
        await server.start()
        idle = [await asyncio.open_connection("127.0.0.1", server.port)
                for _ in range(health.MAX_CONNECTIONS)]
        await asyncio.sleep(0.1)  # all of them accepted and waiting for a line
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            refused = await asyncio.wait_for(reader.read(), 2)  # closed without a reply
            writer.close()
            for _, w in idle:
                w.close()
                await w.wait_closed()
            await asyncio.sleep(0.1)
            after = await _request(server.port, b"GET /healthz HTTP/1.0\r\n\r\n")
        finally:
            await server.stop()
        return len(refused), after

    refused, after = asyncio.run(go())
    assert refused == 0
    assert after.startswith(b"HTTP/1.0 200")


def test_readiness_is_computed_at_most_once_a_second() -> None:
    calls = 0

    async def ready() -> dict[str, bool | str]:
        nonlocal calls
        calls += 1
        return {"database": True}

    async def go() -> None:
        server = HealthServer("127.0.0.1", 0, lambda: True, ready)
        await server.start()
        try:
            for _ in range(20):
                assert (await _request(server.port, b"GET /readyz HTTP/1.0\r\n\r\n")) \
                    .startswith(b"HTTP/1.0 200")
        finally:
            await server.stop()

    asyncio.run(go())
    assert calls == 1
