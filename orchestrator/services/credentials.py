"""The state folder kept to its owner, and the embedded services' credentials in it.

Everything under the state folder (``BPCONSOLE_VAR_DIR``) is the console's user's only:
folders 0700, files 0600, created with those modes from the start (a file written first
and narrowed after is readable by whoever opened it in between). The one exception is
the embedded PostgreSQL's way to its data folder when the console runs as root: the
server runs as its own service user, whose group may traverse (never list) the folders
on that way (:func:`open_way_for`).

The embedded services' passwords are generated once, each in its own file under
``secrets/``, and reach the console's processes only in their URLs, through the
environment and the 0600 ``services.json``: never on a command line, which every local
user can read in ``/proc``.

A ZooKeeper connection string may carry a digest user in front of its hosts,
``user:password@host:port[,host:port...][/chroot]``, as a URL carries one
(:class:`ZkAddress`): the console's clients authenticate with it and create every znode
with an ACL that only that user may use.
"""

from __future__ import annotations

import contextlib
import grp
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from kazoo.client import KazooClient

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# Folders on the PostgreSQL service user's way to its data: traversable by its group.
WAY_DIR_MODE = 0o710
SECRETS_DIR = "secrets"
# The digest user the console's ZooKeeper clients authenticate as.
ZK_USER = "bpconsole"


def private_dir(path: Path) -> Path:
    """``path`` and its missing parents, created 0700; an existing folder of ours that
    others may read, write or enter is narrowed to 0700, keeping only a group's traverse
    bit (:func:`open_way_for`). A folder of another user is left as it is: narrowing it
    is not ours to do."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=PRIVATE_DIR_MODE)
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid == os.geteuid() and mode & 0o067:
        path.chmod(PRIVATE_DIR_MODE | (mode & stat.S_IXGRP))
    return path


def open_way_for(path: Path, top: Path, group: str) -> None:
    """Let ``group`` traverse, not list, every folder from ``top`` down to ``path``'s
    parent (mode 0710, that group). A folder above ``top`` that the group cannot pass
    through yet is given the least that lets it: the group and its traverse bit when the
    folder is ours and its group the superuser's (no one else's access is taken away),
    else the traverse bit for others."""
    gid = grp.getgrnam(group).gr_gid
    top = top.resolve()
    for folder in (path.resolve().parent, *path.resolve().parent.parents):
        info = folder.stat()
        mode = stat.S_IMODE(info.st_mode)
        if folder == top or top in folder.parents:
            if info.st_gid != gid:
                os.chown(folder, -1, gid)
            if mode != WAY_DIR_MODE:
                folder.chmod(WAY_DIR_MODE)
        elif info.st_gid == gid:
            # The group's bits are the ones that apply to its members, whatever others
            # may do.
            if not mode & stat.S_IXGRP:
                folder.chmod(mode | stat.S_IXGRP)
        elif mode & stat.S_IXOTH:
            continue
        elif info.st_uid == os.geteuid() and info.st_gid == 0:
            os.chown(folder, -1, gid)
            folder.chmod(mode | stat.S_IXGRP)
        else:
            folder.chmod(mode | stat.S_IXOTH)


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, the file 0600 from its creation."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)


def secret(var_dir: Path, name: str) -> str:
    """The secret ``name`` of the state folder ``var_dir``: generated on first use (256
    bits, URL-safe), then the same for every later start, so data written under one
    password stays readable. The file is created 0600 in a 0700 folder, exclusively:
    two processes asking at once get the same secret."""
    folder = private_dir(var_dir / SECRETS_DIR)
    path = folder / name
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    except FileExistsError:
        return _read_secret(path)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(secrets.token_urlsafe(32))
        out.flush()
        os.fsync(out.fileno())
    return _read_secret(path)


def _read_secret(path: Path) -> str:
    info = path.stat()
    if stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(PRIVATE_FILE_MODE)
    value = path.read_text(encoding="ascii").strip()
    if not value:
        raise RuntimeError(f"the secret file {path} is empty: remove it to generate another")
    return value


def without_password(url: str) -> str:
    """``url`` with the password of its user part, if any, replaced by ``***``: what
    may be printed or logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


@dataclass(frozen=True)
class ZkAddress:
    """A ZooKeeper connection string split into what kazoo connects to and the digest
    user, if any, that the console's clients authenticate as."""

    hosts: str
    user: str = ""
    password: str = ""

    @classmethod
    def parse(cls, text: str) -> ZkAddress:
        head, at, rest = text.partition("@")
        if not at:
            return cls(text)
        user, colon, password = head.partition(":")
        if not colon or not user or not password:
            raise ValueError("a ZooKeeper user goes before the hosts as user:password@host:port")
        return cls(rest, user, password)

    @property
    def authenticated(self) -> bool:
        return bool(self.user)

    def __str__(self) -> str:
        return f"{self.user}:{self.password}@{self.hosts}" if self.user else self.hosts

    def redacted(self) -> str:
        """The hosts alone: what may be printed or logged."""
        return self.hosts


def zk_client(hosts: str, **options: Any) -> KazooClient:
    """A kazoo client (not started) for the connection string ``hosts``: with a digest
    user, it authenticates as that user and creates every znode with an ACL giving that
    user, and no one else, every permission."""
    from kazoo.client import KazooClient
    from kazoo.security import make_digest_acl

    address = ZkAddress.parse(hosts)
    if address.authenticated:
        options.setdefault("auth_data", [("digest", f"{address.user}:{address.password}")])
        options.setdefault(
            "default_acl", [make_digest_acl(address.user, address.password, all=True)]
        )
    return KazooClient(hosts=address.hosts, **options)
