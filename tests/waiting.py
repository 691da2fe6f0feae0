"""Bounded waits for tests: every wait ends, and one that times out says what it
waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psutil

T = TypeVar("T")


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout_s: float = 120.0,
    every_s: float = 0.2,
    detail: Callable[[], str] | None = None,
) -> T:
    """``check()``'s first truthy result, asked every ``every_s``; after ``timeout_s``
    an AssertionError naming ``what``, with ``detail()`` (what the state was) if given."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() >= deadline:
            said = f": {detail()}" if detail is not None else ""
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s{said}")
        time.sleep(every_s)


def alive(process: psutil.Process) -> bool:
    """The process runs and is not a zombie."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
