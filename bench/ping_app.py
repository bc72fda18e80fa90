"""The steady benchmark's handler: does nothing but report its completion
with one UDP datagram to bench/pingcount.py (PING_PORT)."""

import os
import socket

from jobq import App, Job

app = App()
_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_addr = ("127.0.0.1", int(os.environ.get("PING_PORT", "9")))


@app.handler("noop")
async def noop(job: Job) -> None:
    _sock.sendto(b"1", _addr)
