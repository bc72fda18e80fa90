"""The parent ⇄ child channel of ``--pool process``: length-prefixed JSON
frames over a socket pair.

Why not ``multiprocessing.connection``: under uvloop (``jobq[fast]``) the
parent's socket is non-blocking, and its blocking ``send``/``recv`` broke
off in the middle of any message larger than the socket buffer — a 900 KB
payload killed four children and failed its job as a job of death without
the handler ever running (issue #28 M3). And it unpickles what the child
sends: a handler could make the parent run code. Here the parent reads and
writes through asyncio streams (any size, any loop), the child through a
plain blocking socket, and both sides exchange JSON only.

A frame is a 4-byte big-endian length, then that many bytes of UTF-8 JSON
(a list: the message's kind first). ``MAX_FRAME`` bounds what the parent
will read, so a broken child cannot make it allocate without end.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import uuid
from datetime import datetime
from typing import Any

_HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # payloads and results are bounded far below this


class FrameError(Exception):
    """The other side sent something that is not a frame of ours."""


def _plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode(message: list[Any]) -> bytes:
    body = json.dumps(message, default=_plain, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"a message of {len(body)} bytes is over the {MAX_FRAME} byte frame")
    return _HEADER.pack(len(body)) + body


def _decode(body: bytes) -> list[Any]:
    try:
        msg = json.loads(body)
    except ValueError as exc:
        raise FrameError(f"not JSON: {exc}") from None
    if not isinstance(msg, list) or not msg or not isinstance(msg[0], str):
        raise FrameError("not a message")
    return msg


# ── the parent's side: asyncio streams ──

async def read(reader: asyncio.StreamReader) -> list[Any]:
    """The next message; EOFError once the child is gone."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        if size > MAX_FRAME:
            raise FrameError(f"a frame of {size} bytes announced")
        return _decode(await reader.readexactly(size))
    except asyncio.IncompleteReadError as exc:
        raise EOFError("the child closed its end") from exc


async def write(writer: asyncio.StreamWriter, message: list[Any]) -> None:
    writer.write(encode(message))
    await writer.drain()


# ── the child's side: a blocking socket ──

def recv(sock: socket.socket) -> list[Any]:
    """The next message; EOFError once the parent is gone."""
    (size,) = _HEADER.unpack(_exactly(sock, _HEADER.size))
    return _decode(_exactly(sock, size))


def send(sock: socket.socket, message: list[Any]) -> None:
    sock.sendall(encode(message))


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
