"""A RabbitMQ cluster on this machine, for tests and benchmarks (issue #15).

Three nodes of their own (node names ``jobqc<pid>-<i>@localhost``, AMQP and
distribution ports picked free, data and log directories under /tmp owned by
the rabbitmq user), never the shared broker: nodes 2 and 3 join node 1, so
quorum queues declared on any of them replicate to all three. ``stop(i)``
stops a node as an outage would (the others see it leave); ``start(i)``
brings it back into the cluster. ``close()`` stops all and removes their
directories. The Erlang cookie is the rabbitmq user's, as for the shared
node.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from harness.helpers import free_port, wait_until
from harness.scratch import reachable


def _ctl(node: str, *args: str, env: dict[str, str], timeout: float = 120) -> str:
    out = subprocess.run(["rabbitmqctl", "-n", node, *args], capture_output=True, text=True,
                         env=env, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"rabbitmqctl -n {node} {' '.join(args)}: {out.stdout}{out.stderr}")
    return out.stdout


class Node:
    def __init__(self, name: str, base: Path, user: str) -> None:
        self.name = f"{name}@localhost"
        self.port = free_port()
        self.dir = base / name
        self.dir.mkdir()
        conf = self.dir / "rabbitmq.conf"
        conf.write_text(f"listeners.tcp.default = {self.port}\nloopback_users = none\n"
                        # A node that lost its majority must not keep accepting work alone.
                        "cluster_partition_handling = pause_minority\n")
        (self.dir / "enabled_plugins").write_text("[].\n")
        if os.geteuid() == 0:
            for p in (self.dir, *self.dir.rglob("*")):
                shutil.chown(p, user, user)
        self.env = {**os.environ,
                    "RABBITMQ_NODENAME": self.name,
                    "RABBITMQ_CONFIG_FILE": str(conf),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
                    "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
                    "RABBITMQ_LOG_BASE": str(self.dir / "log"),
                    "RABBITMQ_DIST_PORT": str(free_port()),
                    "RABBITMQ_PID_FILE": str(self.dir / "pid")}

    def url(self, vhost: str = "") -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{vhost}"

    def listening(self) -> bool:
        return reachable("127.0.0.1", self.port)

    def start(self) -> None:
        subprocess.run(["rabbitmq-server", "-detached"], env=self.env, check=True,
                       capture_output=True, timeout=60)
        wait_until(self.listening, 90, f"node {self.name} listening", interval=0.2)
        _ctl(self.name, "--timeout", "90", "await_startup", env=self.env)

    def stop(self) -> None:
        """As an outage: the process ends (SIGKILL if it does not answer)."""
        try:
            _ctl(self.name, "stop", env=self.env, timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired):
            self.kill()

    def pids(self) -> list[int]:
        """This node's Erlang VM: found by its RABBITMQ_NODENAME, not by the
        pid file (a node restarted into a paused cluster once outlived it)."""
        mark = f"RABBITMQ_NODENAME={self.name}".encode()
        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if not f.read().startswith("beam"):
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        out.append(int(pid))
            except OSError:
                continue
        return out

    def kill(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        wait_until(lambda: not self.pids(), 30, f"node {self.name} gone", interval=0.2)


class Cluster:
    def __init__(self, size: int = 3) -> None:
        if not shutil.which("rabbitmq-server"):
            raise RuntimeError("rabbitmq-server is not installed")
        user = "rabbitmq" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.base = Path(tempfile.mkdtemp(prefix="jobq-rabbit-cluster-"))
        if os.geteuid() == 0:
            shutil.chown(self.base, user, user)
        tag = f"jobqc{os.getpid()}x{int(time.time()) % 10000}"
        self.nodes = [Node(f"{tag}-{i + 1}", self.base, user) for i in range(size)]
        self.up = [False] * size

    def start(self) -> None:
        first = self.nodes[0]
        first.start()
        self.up[0] = True
        for i, node in enumerate(self.nodes[1:], start=1):
            node.start()
            _ctl(node.name, "stop_app", env=node.env)
            _ctl(node.name, "join_cluster", first.name, env=node.env)
            _ctl(node.name, "start_app", env=node.env)
            self.up[i] = True
        _ctl(first.name, "await_online_nodes", str(len(self.nodes)), env=first.env)

    def urls(self, vhost: str = "") -> str:
        """JOBQ_AMQP_URL for the whole cluster (comma-separated)."""
        return ",".join(n.url(vhost) for n in self.nodes)

    def add_vhost(self, vhost: str) -> None:
        node = self.live()
        _ctl(node.name, "add_vhost", vhost, env=node.env)
        _ctl(node.name, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*", env=node.env)

    def live(self) -> Node:
        return next(n for n, up in zip(self.nodes, self.up) if up)

    def leader_of(self, vhost: str, queue: str) -> int:
        """Index of the node that leads a quorum queue."""
        node = self.live()
        out = _ctl(node.name, "list_queues", "-p", vhost, "name", "leader", "--no-table-headers",
                   "--quiet", env=node.env)
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == queue:
                return next(i for i, n in enumerate(self.nodes) if n.name == parts[1])
        raise LookupError(f"queue {queue} not found on the cluster: {out!r}")

    def node_of(self, pid: int) -> int:
        """Index of the node process ``pid`` has a connection to."""
        out = subprocess.run(["ss", "-Htnp", "state", "established"], capture_output=True,
                             text=True, check=True).stdout
        for line in out.splitlines():
            if f"pid={pid}," not in line:
                continue
            peer = line.split()[3]  # Recv-Q Send-Q Local Peer Process
            for i, node in enumerate(self.nodes):
                if peer.endswith(f":{node.port}"):
                    return i
        raise LookupError(f"process {pid} has no connection to the cluster")

    def stop(self, i: int) -> None:
        self.nodes[i].stop()
        self.up[i] = False

    def start_again(self, i: int) -> None:
        """Back into the cluster: returns once every node that is up sees it."""
        self.nodes[i].start()
        self.up[i] = True
        node = self.nodes[i]
        _ctl(node.name, "await_online_nodes", str(sum(self.up)), env=node.env)

    def close(self) -> None:
        for node in self.nodes:  # listening or not (a paused node listens on nothing)
            node.kill()
        shutil.rmtree(self.base, ignore_errors=True)
