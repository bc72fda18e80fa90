"""A Docker engine of the tests' own, the local base image and the jobq image
(tests/e2e/test_image.py).

The engine is Debian's ``dockerd`` on a private socket, data and exec roots,
with no bridge and no iptables: every container runs with host networking,
so all traffic stays on 127.0.0.1. Its data root persists between runs
(``/var/lib/jobq-test-docker``), so the base image made with
``deploy/base-image.sh`` and the image's layers are built once per machine;
the engine itself is stopped after the tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOCKET = "/run/jobq-test-docker.sock"
DATA = "/var/lib/jobq-test-docker"
BASE_TAG = "jobq-base:bookworm"
IMAGE_TAG = "jobq:test"


def unavailable() -> str | None:
    """Why no engine can be started here, or None."""
    for tool in ("docker", "dockerd", "mmdebstrap"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"no {tool}: install Debian's docker.io and mmdebstrap (.ci/run does)"
    if os.geteuid() != 0:
        return "dockerd needs root here"
    return None


def docker(*args: str, timeout: float = 600, check: bool = True,
           **kw: object) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["docker", "-H", f"unix://{SOCKET}", *args], capture_output=True,
                         text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert isinstance(out, subprocess.CompletedProcess)
    if check and out.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {out.stderr.strip()[-2000:]}")
    return out


@contextmanager
def engine(logdir: Path) -> Iterator[None]:
    """A dockerd of our own for the duration; reuses one already answering."""
    if docker("info", check=False, timeout=20).returncode == 0:
        yield
        return
    log = open(logdir / "dockerd.log", "wb")
    proc = subprocess.Popen(
        [shutil.which("dockerd") or "/usr/sbin/dockerd", "-H", f"unix://{SOCKET}",
         "--data-root", DATA, "--exec-root", "/run/jobq-test-docker-exec",
         "--pidfile", "/run/jobq-test-docker.pid", "--bridge=none", "--iptables=false",
         "--ip6tables=false"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while docker("info", check=False, timeout=20).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                said = (logdir / "dockerd.log").read_text()[-2000:]
                raise AssertionError(f"dockerd did not start: {said}")
            time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def base_image() -> float:
    """The local Debian base (made once per machine); seconds it took now."""
    if docker("image", "inspect", BASE_TAG, check=False).returncode == 0:
        return 0.0
    start = time.monotonic()
    env = {**os.environ, "DOCKER_HOST": f"unix://{SOCKET}"}
    out = subprocess.run(["bash", str(ROOT / "deploy" / "base-image.sh"), BASE_TAG], env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return time.monotonic() - start


def build_image() -> tuple[float, int]:
    """Build the jobq image on the local base: (seconds, bytes)."""
    start = time.monotonic()
    docker("build", "--quiet", "--network", "host", "--build-arg", f"BASE={BASE_TAG}",
           "-f", "deploy/Dockerfile", "-t", IMAGE_TAG, ".", cwd=ROOT, timeout=900)
    took = time.monotonic() - start
    size = int(docker("image", "inspect", "--format", "{{.Size}}", IMAGE_TAG).stdout.strip())
    return took, size
