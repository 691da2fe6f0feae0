"""CPU quotas by cgroup: which hierarchy has a usable cpu controller, and how many
microseconds per period a number of cores is (pure; the cgroups themselves are made by
tests/orchestrator/run/test_capped_workers.py and the benches)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.services.cpu_quota import (
    MIN_QUOTA_US,
    PERIOD_US,
    Hierarchy,
    QuotaError,
    find_hierarchy,
    quota_us,
)

V1 = """\
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,memory 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,nosuid,cpu,cpuacct 0 0
"""


def test_a_core_is_a_whole_period_and_a_sliver_is_the_kernel_s_least() -> None:
    assert quota_us(1.0) == PERIOD_US
    assert quota_us(0.25) == PERIOD_US // 4
    assert quota_us(1e-9) == MIN_QUOTA_US
    for bad in (0.0, -1.0, float("nan")):
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
