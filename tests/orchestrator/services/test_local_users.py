"""Another local user of the host gets nothing from the console's embedded services or
its state folder: each attempt is made for real, as the Unix user ``nobody``, by the
system's Python speaking each service's own protocol (``local_user_probe.py``)."""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings
from kazoo.security import OPEN_ACL_UNSAFE

from orchestrator.services.credentials import (
    ZK_USER,
    ZkAddress,
    open_way_for,
    private_dir,
    zk_client,
)
from orchestrator.services.embedded import ZooKeeper, free_port
from orchestrator.services.launcher import Endpoints
from tests.conftest import TEST_VAR_DIR

pytestmark = pytest.mark.integration

PROBE = Path(__file__).with_name("local_user_probe.py")
OTHER_USER = "nobody"
# An interpreter another user may run: the project's own may live under a home folder
# only its owner can enter.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def probe_as_another_user(services: Endpoints) -> dict[str, Any]:
    if os.geteuid() != 0:
        pytest.skip("trying the services as a second Unix user needs root to switch to it")
    assert SYSTEM_PYTHON, "no system python3 in /usr/bin or /bin for the second user"
    zk_port = int(ZkAddress.parse(services.zk_hosts).hosts.rpartition(":")[2])
    result = subprocess.run(
        [
            SYSTEM_PYTHON,
            "-",
            str(_port(services.database_url)),
            str(_port(services.redis_url)),
            str(zk_port),
            settings.ZK_ROOT,
            str(TEST_VAR_DIR),
            str(TEST_VAR_DIR / "postgresql" / "data"),
        ],
        input=PROBE.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        user=OTHER_USER,
        group="nogroup",
        extra_groups=[],
        cwd="/",
        check=False,
    )
    assert result.returncode == 0, f"the probe failed: {result.stderr}"
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["uid"] != 0
    return report


def test_another_user_gets_no_database_session(services: Endpoints) -> None:
    report = probe_as_another_user(services)
    # Over TCP the server asks for the password (SCRAM), it does not trust loopback
    assert report["postgres_tcp"] == "sasl"
    # and its Unix socket, which it trusts, lies in a folder nobody else may enter
    assert report["postgres_socket"] == "permission denied"


def test_another_user_gets_nothing_from_redis(services: Endpoints) -> None:
    report = probe_as_another_user(services)
    assert report["redis_ping"].startswith("-NOAUTH")
    assert report["redis_config"].startswith("-NOAUTH")


def test_the_consoles_own_redis_user_cannot_rewrite_the_servers_files(
    services: Endpoints,
) -> None:
    client = redis.Redis.from_url(services.redis_url)
    try:
        assert client.ping()
        for command in (("CONFIG", "SET", "dir", "/"), ("SAVE",), ("MODULE", "LIST")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
    finally:
        client.close()


def test_another_user_can_create_no_znode(services: Endpoints) -> None:
    report = probe_as_another_user(services)
    no_auth = -102
    assert report["zookeeper"] == {f"{settings.ZK_ROOT}/intruder": no_auth, "/intruder": no_auth}


def test_every_znode_under_the_root_is_the_consoles_users_only(services: Endpoints) -> None:
    client = zk_client(services.zk_hosts, timeout=10)
    client.start(10)
    try:
        client.ensure_path(f"{settings.ZK_ROOT}/probe/deeper")
        seen = 0
        pending = [settings.ZK_ROOT]
        while pending:
            path = pending.pop()
            acl, _ = client.get_acls(path)
            assert [(a.id.scheme, a.id.id.partition(":")[0]) for a in acl] == [
                ("digest", ZK_USER)
            ], path
            seen += 1
            pending.extend(f"{path}/{child}" for child in client.get_children(path))
        assert seen >= 3
    finally:
        client.delete(f"{settings.ZK_ROOT}/probe", recursive=True)
        client.stop()
        client.close()


def test_a_znode_left_open_is_taken_back_when_zookeeper_starts(tmp_path: Path) -> None:
    # Given a ZooKeeper whose data holds a world-writable znode under the console's root
    server = ZooKeeper(
        "zookeeper",
        tmp_path / "zookeeper.log",
        data_dir=tmp_path / "zk" / "data",
        port=free_port(),
        password="the-consoles-password",
        root="/console",
    )
    server.start()
    try:
        client = zk_client(server.url(), timeout=10)
        client.start(10)
        client.create("/console/open", b"", acl=OPEN_ACL_UNSAFE)
        client.stop()
        client.close()
        # When it is started again
        server.stop()
        server.start()
        # then the znode's ACL is the console's user's alone
        client = zk_client(server.url(), timeout=10)
        client.start(10)
        acl, _ = client.get_acls("/console/open")
        client.stop()
        client.close()
        assert [a.id.scheme for a in acl] == ["digest"]
    finally:
        server.stop()


def test_another_user_can_neither_list_the_state_folder_nor_read_its_files(
    services: Endpoints,
) -> None:
    report = probe_as_another_user(services)
    assert report["state_folder"] == {
        "list": "permission denied",
        "services.json": "permission denied",
        "secrets/postgresql": "permission denied",
        "secrets/redis": "permission denied",
        "secrets/zookeeper": "permission denied",
    }


def test_the_state_folders_secrets_are_0600_in_0700_folders(services: Endpoints) -> None:
    for name in ("postgresql", "redis", "zookeeper"):
        assert stat.S_IMODE((TEST_VAR_DIR / "secrets" / name).stat().st_mode) == 0o600
    assert stat.S_IMODE((TEST_VAR_DIR / "secrets").stat().st_mode) == 0o700
    assert stat.S_IMODE((TEST_VAR_DIR / "services.json").stat().st_mode) == 0o600
    for config in (TEST_VAR_DIR / "redis" / "redis.conf", TEST_VAR_DIR / "zookeeper" / "zoo.cfg"):
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
    # Others may never enter; the PostgreSQL server's group may only pass through
    mode = stat.S_IMODE(TEST_VAR_DIR.stat().st_mode)
    assert mode & 0o067 == 0, oct(mode)
    # and no password is on any process's command line
    passwords = [(TEST_VAR_DIR / "secrets" / n).read_text() for n in ("postgresql", "redis")]
    for process in Path("/proc").iterdir():
        try:
            command = (process / "cmdline").read_bytes()
        except OSError:
            continue
        assert not any(p.encode() in command for p in passwords), process


@pytest.mark.usefixtures("services")  # the PostgreSQL server's user exists once it ran
def test_a_state_folder_inside_another_opens_no_way_into_the_outer_one(tmp_path: Path) -> None:
    """A second console's state folder inside the first's (a benchmark's, a test's) lets
    the PostgreSQL server's group through the outer folder, and no one else."""
    if os.geteuid() != 0:
        pytest.skip("the PostgreSQL server runs as a user of its own only under root")
    outer = private_dir(tmp_path / "outer")
    inner = outer / "inner"
    data = private_dir(inner / "postgresql" / "data")
    open_way_for(data, inner, "pgserver")
    # Then the outer folder lets the server's group through, and others still not
    mode = stat.S_IMODE(outer.stat().st_mode)
    assert mode & 0o007 == 0, oct(mode)
    assert mode & 0o010, oct(mode)
    assert outer.stat().st_gid == grp.getgrnam("pgserver").gr_gid
    # and the inner one is the group's way in, listed by no one but its owner
    assert stat.S_IMODE(inner.stat().st_mode) == 0o710
