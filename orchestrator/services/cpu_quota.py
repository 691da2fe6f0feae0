"""CPU quotas made by the operating system: one cgroup per process, each with a CFS quota.

    with CpuQuotas({"w1": 1.0, "w2": 0.5}, prefix=f"bpconsole-bench-{os.getpid()}") as q:
        subprocess.Popen(q.launch_argv("w1", argv))

Each name gets a cgroup ``<prefix>-<name>`` allowed ``cores`` CPUs' worth of time per
100 ms period: with cgroup v1, ``cpu.cfs_period_us`` = 100000 and ``cpu.cfs_quota_us`` =
cores x 100000 under the hierarchy the ``cpu`` controller is mounted on; with cgroup v2,
``cpu.max`` = "quota period" in a child of the unified hierarchy's root, once the root's
``cgroup.subtree_control`` enables ``cpu`` (enabled here if the root offers it). v1 is
taken when the cpu controller is mounted there, else v2 when its root offers ``cpu``.

:meth:`CpuQuotas.launch_argv` wraps a command so that its process enters the cgroup
before it runs anything (``sh -c 'echo $$ > <cgroup>/cgroup.procs && exec "$@"'``): the
command and every process it starts (a Celery worker's pool, its JVM) are inside.

On leaving, any process still in a cgroup is moved to the hierarchy's root and the
cgroup removed. Anything that stops the quotas from being made (not root and the
hierarchy not writable, no cpu controller, a cgroup that cannot be created or given its
quota) raises :class:`QuotaError` with a one-line reason, after removing whatever
cgroups it had made: nothing is left behind. A process killed before it could leave
(SIGKILL) leaves its cgroups and what runs in them: :func:`remove_orphans`, called with
the same prefix before making new ones, stops those processes and removes the cgroups of
owners that are gone.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel's smallest CFS quota
CGROUP_ROOT = Path("/sys/fs/cgroup")


class QuotaError(RuntimeError):
    """The quotas cannot be made here; the message says which part failed and why."""


@dataclass(frozen=True)
class Hierarchy:
    """Where the cpu controller can be used: cgroup ``version`` 1 or 2, at ``root``."""

    version: int
    root: Path

    @property
    def procs(self) -> Path:
        return self.root / "cgroup.procs"


def _mounts(text: str | None = None) -> list[tuple[Path, str, set[str]]]:
    """(mount point, file system type, options) of every cgroup mount."""
    if text is None:
        text = Path("/proc/self/mounts").read_text()
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] in {"cgroup", "cgroup2"}:
            found.append((Path(fields[1]), fields[2], set(fields[3].split(","))))
    return found


def find_hierarchy(mounts: str | None = None) -> Hierarchy:
    """The cgroup hierarchy whose cpu controller this process may use, or QuotaError."""
    entries = _mounts(mounts)
    for point, kind, options in entries:
        if kind == "cgroup" and "cpu" in options:
            return _writable(Hierarchy(1, point))
    unified = [point for point, kind, _ in entries if kind == "cgroup2"]
    for point in unified:
        controllers = _read(point / "cgroup.controllers").split()
        if "cpu" in controllers:
            hierarchy = _writable(Hierarchy(2, point))
            _enable_cpu(point)
            return hierarchy
    where = ", ".join(str(p) for p in unified) or "none mounted"
    raise QuotaError(
        "no cpu controller: cgroup v1 has no cpu hierarchy mounted and no cgroup v2 "
        f"hierarchy offers cpu in cgroup.controllers ({where})"
    )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _writable(hierarchy: Hierarchy) -> Hierarchy:
    if not os.access(hierarchy.root, os.W_OK):
        who = "not root" if os.geteuid() != 0 else "root"
        raise QuotaError(
            f"cpu controller not writable: {who} (uid {os.geteuid()}) and cgroup "
            f"v{hierarchy.version} hierarchy {hierarchy.root} is not writable"
        )
    return hierarchy


def _enable_cpu(root: Path) -> None:
    control = root / "cgroup.subtree_control"
    if "cpu" in _read(control).split():
        return
    try:
        control.write_text("+cpu")
    except OSError as error:
        raise QuotaError(
            f"cpu controller not enabled: cannot write +cpu to {control} ({error.strerror})"
        ) from None


def quota_us(cores: float) -> int:
    """The CFS quota per period for ``cores`` CPUs' worth of time."""
    if not (cores > 0 and math.isfinite(cores)):
        raise QuotaError(f"a quota is a positive number of cores, not {cores:g}")
    return max(MIN_QUOTA_US, round(cores * PERIOD_US))


class CpuQuotas:
    """Cgroups ``<prefix>-<name>`` with ``cores`` each, while the context is entered."""

    def __init__(
        self, cores: dict[str, float], prefix: str, *, hierarchy: Hierarchy | None = None
    ) -> None:
        self.cores = dict(cores)
        self.prefix = prefix
        self.hierarchy = hierarchy
        self.made: dict[str, Path] = {}

    def __enter__(self) -> CpuQuotas:
        for cores in self.cores.values():
            quota_us(cores)  # every quota checked before anything is made
        hierarchy = self.hierarchy or find_hierarchy()
        self.hierarchy = hierarchy
        try:
            for name, cores in self.cores.items():
                path = hierarchy.root / f"{self.prefix}-{name}"
                try:
                    path.mkdir()
                except OSError as error:
                    raise QuotaError(
                        f"cgroup not created: mkdir {path} failed ({error.strerror})"
                    ) from None
                self.made[name] = path
                self._set_quota(path, quota_us(cores))
        except BaseException:
            self.remove()
            raise
        return self

    def _set_quota(self, path: Path, quota: int) -> None:
        try:
            if self.hierarchy is not None and self.hierarchy.version == 1:
                (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (path / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        except OSError as error:
            raise QuotaError(
                f"cgroup {path} not given its quota of {quota} us per {PERIOD_US} us "
                f"({error.strerror})"
            ) from None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()

    def path(self, name: str) -> Path:
        return self.made[name]

    def launch_argv(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run inside cgroup ``name`` from its first instruction: a shell that
        moves itself into the cgroup, then becomes the command (same pid)."""
        procs = shlex.quote(str(self.path(name) / "cgroup.procs"))
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]

    def pids(self, name: str) -> list[int]:
        return [int(p) for p in _read(self.path(name) / "cgroup.procs").split()]

    def stat(self, name: str) -> dict[str, int]:
        """The cgroup's ``cpu.stat`` counters (periods throttled, time throttled, ...)."""
        out = {}
        for line in _read(self.path(name) / "cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
        return out

    def quota_text(self, name: str) -> str:
        """The quota as the kernel holds it: ``quota/period`` in microseconds."""
        path = self.path(name)
        if self.hierarchy is not None and self.hierarchy.version == 1:
            quota = _read(path / "cpu.cfs_quota_us").strip()
            return f"{quota}/{_read(path / 'cpu.cfs_period_us').strip()}"
        return "/".join(_read(path / "cpu.max").split())

    def remove(self) -> None:
        """Move what is left in each cgroup to the root, then remove the cgroups."""
        if self.hierarchy is None:
            return
        for name, path in list(self.made.items()):
            _remove_cgroup(self.hierarchy, path)
            del self.made[name]


def remove_orphans(base: str, hierarchy: Hierarchy | None = None) -> list[str]:
    """Remove the cgroups ``<base>-<pid>-<name>`` whose owner ``pid`` no longer runs,
    killing whatever still runs in them (what the owner started and could not stop);
    the names removed. Nothing when no cpu hierarchy can be used here."""
    if hierarchy is None:
        try:
            hierarchy = find_hierarchy()
        except QuotaError:
            return []
    pattern = re.compile(rf"{re.escape(base)}-(\d+)-.+")
    removed = []
    for path in sorted(hierarchy.root.iterdir()):
        match = pattern.fullmatch(path.name)
        if match is None or not path.is_dir() or _alive(int(match.group(1))):
            continue
        for pid in _read(path / "cgroup.procs").split():
            with contextlib.suppress(OSError):  # gone meanwhile
                os.kill(int(pid), signal.SIGKILL)
        _remove_cgroup(hierarchy, path)
        removed.append(path.name)
    return removed


def _remove_cgroup(hierarchy: Hierarchy, path: Path) -> None:
    """Move what is left in the cgroup at ``path`` to the root, then remove it."""
    for _ in range(50):
        for pid in _read(path / "cgroup.procs").split():
            with contextlib.suppress(OSError):  # gone meanwhile
                hierarchy.procs.write_text(pid)
        try:
            path.rmdir()
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)  # a process entering or exiting: try again
            continue
        return
    raise QuotaError(f"cgroup {path} could not be removed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True
