"""CPU quotas by cgroup: which hierarchy has a usable cpu controller, how many
microseconds per period a number of cores is, and the cgroups an owner killed outright
left behind (real cgroups: skipped, with the reason, where none can be made; the quotas
at work are in tests/orchestrator/run/test_capped_workers.py and the benches)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.services.cpu_quota import (
    MIN_QUOTA_US,
    PERIOD_US,
    CpuQuotas,
    Hierarchy,
    QuotaError,
    find_hierarchy,
    quota_us,
    remove_orphans,
)
from tests.waiting import wait_for

V1 = """\
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,memory 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,nosuid,cpu,cpuacct 0 0
"""


def test_a_core_is_a_whole_period_and_a_sliver_is_the_kernel_s_least() -> None:
    assert quota_us(1.0) == PERIOD_US
    assert quota_us(0.25) == PERIOD_US // 4
    assert quota_us(1e-9) == MIN_QUOTA_US
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(QuotaError, match="positive number of cores"):
            quota_us(bad)


def test_cgroup_v1_s_cpu_mount_is_taken_when_writable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.access", lambda path, mode: True)
    assert find_hierarchy(V1) == Hierarchy(1, Path("/sys/fs/cgroup/cpu"))


def test_a_hierarchy_nobody_may_write_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.access", lambda path, mode: False)
    with pytest.raises(QuotaError, match="cpu controller not writable"):
        find_hierarchy(V1)


def test_no_cpu_controller_anywhere_says_where_it_looked() -> None:
    mounts = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
    with pytest.raises(QuotaError, match=r"no cpu controller.*none mounted"):
        find_hierarchy(mounts)


def test_the_cgroups_of_an_owner_that_is_gone_go_with_what_runs_in_them() -> None:
    # One owner was killed outright (its pid no longer runs) and left a process in its
    # cgroup; another, this test, still runs. Only the first's go, its process killed.
    base = "bpconsole-test-orphans"
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = CpuQuotas({"w1": 0.1}, prefix=f"{base}-{gone.pid}")
    mine = CpuQuotas({"w1": 0.1}, prefix=f"{base}-{os.getpid()}")
    try:
        left.__enter__()
        mine.__enter__()
    except QuotaError as error:
        left.remove()
        pytest.skip(f"no CPU quota can be made here: {error}")
    try:
        orphan = subprocess.Popen(left.launch_argv("w1", ["sleep", "600"]))
        wait_for("the orphan in its cgroup", lambda: left.pids("w1") == [orphan.pid], 10)

        removed = remove_orphans(base)

        assert removed == [f"{base}-{gone.pid}-w1"]
        assert orphan.wait(10) == -9
        assert not left.path("w1").exists()
        assert mine.path("w1").exists()
    finally:
        mine.remove()
        if left.path("w1").exists():
            left.remove()
