"""Bounded waits for tests: every wait ends, and one that times out says what it
waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psutil

T = TypeVar("T")


def wait_for(
    what: str, check: Callable[[], T], timeout_s: float = 120.0, every_s: float = 0.2
) -> T:
    """``check()``'s first truthy result, asked every ``every_s``; an AssertionError
    naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f} s"
        time.sleep(every_s)


def alive(process: psutil.Process) -> bool:
    """The process runs and is not a zombie."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
