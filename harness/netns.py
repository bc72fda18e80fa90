"""A host of its own for one process: a network namespace with two links to
this machine (issue #15), so a partition can be made without closing any
TCP connection.

Link "db" (10.77.<k>.0/24) carries PostgreSQL, link "mq" (10.78.<k>.0/24)
carries RabbitMQ: each is a veth pair, and on this side a socat forwarder
listens on the link's address and relays to the shared server on loopback.
``cut(link)`` takes this side of the veth down: packets stop both ways, the
process's sockets stay open and see silence (as when a host or a switch
vanishes), and the servers' sessions stay open behind the forwarder (as
they do until TCP keepalive gives up). ``heal(link)`` brings it back.
Needs root (``ip netns``); ``available()`` says whether this machine can.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from urllib.parse import urlsplit, urlunsplit

from harness.helpers import free_port

_next = itertools.count(1)
LINKS = {"db": 77, "mq": 78}


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def available() -> str | None:
    """None if namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip") or not shutil.which("socat"):
        return "needs iproute2 and socat (apt-get install iproute2 socat)"
    return None


class Host:
    def __init__(self) -> None:
        self.k = (os.getpid() * 7 + next(_next)) % 200 + 20
        self.name = f"jq{os.getpid() % 100000}n{self.k}"
        self._forwarders: list[subprocess.Popen[bytes]] = []
        _ip("netns", "add", self.name)
        try:
            _ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
            for link, net in LINKS.items():
                here, there = self._dev(link, "h"), self._dev(link, "n")
                _ip("link", "add", here, "type", "veth", "peer", "name", there)
                _ip("link", "set", there, "netns", self.name)
                _ip("addr", "add", f"10.{net}.{self.k}.1/24", "dev", here)
                _ip("link", "set", here, "up")
                _ip("netns", "exec", self.name, "ip", "addr", "add",
                    f"10.{net}.{self.k}.2/24", "dev", there)
                _ip("netns", "exec", self.name, "ip", "link", "set", there, "up")
        except BaseException:
            self.close()
            raise

    def _dev(self, link: str, side: str) -> str:
        return f"{link}{side}{os.getpid() % 10000}x{self.k}"[:15]

    def address(self, link: str) -> str:
        """This machine's address on the link (what the process connects to)."""
        return f"10.{LINKS[link]}.{self.k}.1"

    def forward(self, link: str, url: str) -> str:
        """A forwarder for ``url``'s server over ``link``; returns the URL the
        process in the namespace uses instead."""
        u = urlsplit(url)
        port = free_port()
        target = f"{u.hostname or '127.0.0.1'}:{u.port or (5432 if link == 'db' else 5672)}"
        self._forwarders.append(subprocess.Popen(
            ["socat", f"TCP-LISTEN:{port},bind={self.address(link)},fork,reuseaddr",
             f"TCP:{target}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        auth = u.netloc.rpartition("@")[0]
        netloc = f"{auth + '@' if auth else ''}{self.address(link)}:{port}"
        return urlunsplit(u._replace(netloc=netloc))

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self, *links: str) -> None:
        for link in links or tuple(LINKS):
            _ip("link", "set", self._dev(link, "h"), "down")

    def heal(self, *links: str) -> None:
        for link in links or tuple(LINKS):
            _ip("link", "set", self._dev(link, "h"), "up")

    def close(self) -> None:
        for f in self._forwarders:
            f.send_signal(signal.SIGKILL)
            f.wait(5)
        for link in LINKS:
            subprocess.run(["ip", "link", "del", self._dev(link, "h")], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
