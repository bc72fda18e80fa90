"""The latency benchmarks' handler: reports, with one UDP datagram to
LAT_PORT, how long after its publish (the payload's "t", time.time() of the
publisher on this machine) the handler started, after the payload's "i"
if it has one."""

import os
import socket
import time

from jobq import App, Job

app = App()
_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_addr = ("127.0.0.1", int(os.environ.get("LAT_PORT", "9")))


@app.handler("lat")
async def lat(job: Job) -> None:
    took = str(time.time() - job.payload["t"])
    i = job.payload.get("i")  # bench/idle_cost.py matches each job to its publish
    _sock.sendto((took if i is None else f"{i} {took}").encode(), _addr)
