"""What another local user gets from the console's services and state folder.

Run by the system's Python as a second Unix user (``tests/orchestrator/services/
test_local_users.py`` sends this text on standard input): the standard library only,
each service spoken to in its own wire protocol, as an attacker with a shell would.
Prints one JSON object of what each attempt answered.

Usage: ``python3 - PG_PORT REDIS_PORT ZK_PORT ZK_ROOT VAR_DIR PG_SOCKET_DIR``
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from pathlib import Path

LOOPBACK = "127.0.0.1"


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def postgres_auth(port: int) -> str:
    """The server's first answer to a startup message as ``postgres``: ``ok`` (trusted,
    a session), ``sasl`` (SCRAM asked for), ``password``/``md5``, or ``error ...``."""
    params = b"user\0postgres\0database\0postgres\0\0"
    body = struct.pack("!i", 196608) + params
    with socket.create_connection((LOOPBACK, port), timeout=5) as sock:
        sock.sendall(struct.pack("!i", len(body) + 4) + body)
        kind = _recv_exactly(sock, 1)
        length = struct.unpack("!i", _recv_exactly(sock, 4))[0]
        payload = _recv_exactly(sock, length - 4)
    if kind == b"R":
        code = struct.unpack("!i", payload[:4])[0]
        return {0: "ok", 3: "password", 5: "md5", 10: "sasl"}.get(code, f"auth {code}")
    return f"error {payload[:200]!r}"


def postgres_socket(folder: str, port: int) -> str:
    """Whether the server's Unix socket can be reached at all."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(Path(folder) / f".s.PGSQL.{port}"))
    except PermissionError:
        return "permission denied"
    except OSError as error:
        return f"refused: {error.strerror}"
    return "connected"


def redis_answer(port: int, command: bytes) -> str:
    with socket.create_connection((LOOPBACK, port), timeout=5) as sock:
        sock.sendall(command + b"\r\n")
        return sock.recv(200).decode("utf-8", "replace").strip()


def _zk_frame(payload: bytes) -> bytes:
    return struct.pack("!i", len(payload)) + payload


def _zk_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!i", len(raw)) + raw


def zk_create(port: int, paths: list[str]) -> dict[str, int]:
    """ZooKeeper's error code for creating each of ``paths`` with an open ACL, in an
    unauthenticated session: 0 created, -102 NoAuth, -110 exists, -101 no parent."""
    codes: dict[str, int] = {}
    with socket.create_connection((LOOPBACK, port), timeout=10) as sock:
        connect = struct.pack("!iqiq", 0, 0, 10000, 0) + struct.pack("!i", 16) + bytes(16)
        sock.sendall(_zk_frame(connect + b"\0"))
        length = struct.unpack("!i", _recv_exactly(sock, 4))[0]
        _recv_exactly(sock, length)
        for xid, path in enumerate(paths, start=1):
            world_all = struct.pack("!ii", 1, 31) + _zk_string("world") + _zk_string("anyone")
            request = (
                struct.pack("!ii", xid, 1)  # header: xid, create
                + _zk_string(path)
                + struct.pack("!i", 1)
                + b"x"
                + world_all
                + struct.pack("!i", 0)  # persistent
            )
            sock.sendall(_zk_frame(request))
            length = struct.unpack("!i", _recv_exactly(sock, 4))[0]
            reply = _recv_exactly(sock, length)
            codes[path] = struct.unpack("!iqi", reply[:16])[2]
    return codes


def state_folder(var_dir: str) -> dict[str, str]:
    """What listing the state folder and opening its files gives."""
    found: dict[str, str] = {}
    try:
        next(Path(var_dir).iterdir(), None)
        found["list"] = "listed"
    except PermissionError:
        found["list"] = "permission denied"
    for name in ("services.json", "secrets/postgresql", "secrets/redis", "secrets/zookeeper"):
        try:
            with (Path(var_dir) / name).open("rb") as handle:
                handle.read(1)
            found[name] = "read"
        except PermissionError:
            found[name] = "permission denied"
        except FileNotFoundError:
            found[name] = "missing"
    return found


def main() -> None:
    pg_port, redis_port, zk_port = (int(a) for a in sys.argv[1:4])
    zk_root, var_dir, pg_socket_dir = sys.argv[4:7]
    report = {
        "uid": os.getuid(),
        "postgres_tcp": postgres_auth(pg_port),
        "postgres_socket": postgres_socket(pg_socket_dir, pg_port),
        "redis_ping": redis_answer(redis_port, b"PING"),
        "redis_config": redis_answer(redis_port, b"CONFIG GET dir"),
        "zookeeper": zk_create(zk_port, [f"{zk_root}/intruder", "/intruder"]),
        "state_folder": state_folder(var_dir),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
