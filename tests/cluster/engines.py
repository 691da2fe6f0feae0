"""A Spark standalone cluster and a ZooKeeper ensemble on loopback, from the jars in the
pyspark wheel: the engines an operator would run on separate hosts, as child processes
of the test (each with a parent-death signal, so none outlives pytest)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from orchestrator.services.embedded import LOOPBACK, die_with_parent, free_port, pyspark_jars

JAVA = shutil.which("java") or "java"


@dataclass
class JavaDaemon:
    """One JVM process: launched, waited for, killed or stopped."""

    name: str
    command: list[str]
    log_file: Path
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    process: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                env=dict(self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509
            )

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} was never launched")
        return self.process.pid

    def wait_for(self, condition: Callable[[], bool], what: str, timeout_s: float) -> None:
        """Poll ``condition`` until it holds; fail naming ``what`` and the log otherwise."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.process.returncode} waiting for "
                    f"{what}; see {self.log_file}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name}: no {what} after {timeout_s} s; see {self.log_file}"
                )
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no goodbye to the master or the quorum."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


def _json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 (loopback, ours)
        return json.load(answer)


class MasterApp(TypedDict):
    """An application as the master's ``/json`` lists it."""

    id: str
    name: str
    cores: int
    state: str


class MasterView(TypedDict):
    status: str
    aliveworkers: int
    activeapps: list[MasterApp]


def spark_env() -> dict[str, str]:
    """What the wheel's scripts (``load-spark-env.sh``) would set for a daemon: a worker
    builds each executor's command from SPARK_HOME's jars folder and the Scala version
    (without it, it looks for a source build: "Cannot find any build directories");
    status pages bind to SPARK_LOCAL_IP, else to every interface."""
    jars = pyspark_jars()
    core = next(jars.glob("spark-core_*.jar")).name  # spark-core_2.13-4.3.0.jar
    scala = core.removeprefix("spark-core_").split("-")[0]
    return {
        **os.environ,
        "SPARK_HOME": str(jars.parent),
        "SPARK_SCALA_VERSION": scala,
        "SPARK_LOCAL_IP": LOOPBACK,
    }


def spark_daemon(main_class: str, port: int, ui_port: int, *arguments: str) -> list[str]:
    """The command of a standalone master or worker, on loopback, from the wheel's jars."""
    return [
        JAVA,
        "-Xmx256m",
        "-cp",
        f"{pyspark_jars()}/*",
        main_class,
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--webui-port",
        str(ui_port),
        *arguments,
    ]


@dataclass
class SparkMaster:
    """A standalone master: RPC on ``port``, its status page (``/json``) on ``ui_port``."""

    daemon: JavaDaemon
    port: int
    ui_port: int

    @classmethod
    def create(cls, log_dir: Path) -> SparkMaster:
        port, ui_port = free_port(), free_port()
        command = spark_daemon("org.apache.spark.deploy.master.Master", port, ui_port)
        env = spark_env()
        return cls(
            JavaDaemon("spark-master", command, log_dir / "spark-master.log", env), port, ui_port
        )

    @property
    def url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    def view(self) -> MasterView | None:
        """The master's state, or None while its web UI does not serve it yet: not
        listening, or (seen once in CI) answering ``/json/`` with its HTML page while
        its handlers are still being attached."""
        try:
            return _json(f"http://{LOOPBACK}:{self.ui_port}/json/")  # type: ignore[return-value]
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        view = self.view()
        return 0 if view is None else view["aliveworkers"]

    def apps(self) -> list[MasterApp]:
        view = self.view()
        return [] if view is None else view["activeapps"]

    def alive(self) -> bool:
        view = self.view()
        return view is not None and view["status"] == "ALIVE"

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        self.daemon.wait_for(self.alive, "ALIVE status", timeout_s)


@dataclass
class SparkWorker:
    """A standalone worker offering ``cores`` and ``memory`` to the master's applications."""

    daemon: JavaDaemon

    @classmethod
    def create(
        cls, name: str, master: SparkMaster, log_dir: Path, *, cores: int = 1, memory: str = "1g"
    ) -> SparkWorker:
        port, ui_port = free_port(), free_port()
        work_dir = log_dir / name
        work_dir.mkdir(parents=True, exist_ok=True)
        command = spark_daemon(
            "org.apache.spark.deploy.worker.Worker",
            port,
            ui_port,
            *("--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir), master.url),
        )
        env = spark_env()
        return cls(JavaDaemon(name, command, log_dir / f"{name}.log", env))

    def restarted(self) -> SparkWorker:
        """The same worker (same ports, same work folder) to start again, as a service
        manager would after it died."""
        old = self.daemon
        return SparkWorker(JavaDaemon(old.name, old.command, old.log_file, old.env))


@dataclass
class QuorumPeer:
    """One server of a ZooKeeper ensemble."""

    daemon: JavaDaemon
    client_port: int

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.client_port}"

    def srvr(self) -> str:
        """The server's own report (``srvr``): its mode once it serves, else why not."""
        try:
            with socket.create_connection((LOOPBACK, self.client_port), timeout=1) as sock:
                sock.sendall(b"srvr")
                chunks = []
                while chunk := sock.recv(4096):
                    chunks.append(chunk)
        except OSError:
            return ""
        return b"".join(chunks).decode(errors="replace")

    def serving(self) -> bool:
        return self.mode() is not None

    def mode(self) -> str | None:
        """``leader`` or ``follower`` while it serves, ``None`` otherwise."""
        for line in self.srvr().splitlines():
            if line.startswith("Mode: "):
                return line.removeprefix("Mode: ").strip()
        return None


@dataclass
class ZooKeeperEnsemble:
    """``size`` servers on loopback, each with its own data folder, ``myid`` and ports."""

    peers: list[QuorumPeer]

    @classmethod
    def create(cls, base: Path, size: int = 3, heap_mb: int = 128) -> ZooKeeperEnsemble:
        ports = [(free_port(), free_port(), free_port()) for _ in range(size)]
        servers = "".join(
            f"server.{n}={LOOPBACK}:{peer}:{election}\n"
            for n, (_, peer, election) in enumerate(ports, start=1)
        )
        peers = []
        for n, (client, _, _) in enumerate(ports, start=1):
            folder = base / f"zk{n}"
            data = folder / "data"
            data.mkdir(parents=True, exist_ok=True)
            (data / "myid").write_text(f"{n}\n")
            config = folder / "zoo.cfg"
            config.write_text(
                "tickTime=2000\n"
                "initLimit=10\n"
                "syncLimit=5\n"
                f"dataDir={data}\n"
                f"clientPort={client}\n"
                f"clientPortAddress={LOOPBACK}\n"
                "admin.enableServer=false\n"
                "4lw.commands.whitelist=srvr\n"
                "maxClientCnxns=200\n" + servers
            )
            command = [
                JAVA,
                f"-Xmx{heap_mb}m",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                f"{pyspark_jars()}/*",
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                str(config),
            ]
            daemon = JavaDaemon(f"zk{n}", command, base / f"zk{n}.log")
            peers.append(QuorumPeer(daemon, client))
        return cls(peers)

    @property
    def hosts(self) -> str:
        return ",".join(p.address for p in self.peers)

    def launch(self) -> None:
        for peer in self.peers:
            peer.daemon.launch()

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Until every server serves and one of them leads."""
        for peer in self.peers:
            peer.daemon.wait_for(peer.serving, "quorum", timeout_s)
        leader = self.peers[0].daemon
        leader.wait_for(lambda: self.leader() is not None, "leader", timeout_s)

    def leader(self) -> QuorumPeer | None:
        return next((p for p in self.peers if p.mode() == "leader"), None)

    def stop(self) -> None:
        for peer in self.peers:
            peer.daemon.stop()
