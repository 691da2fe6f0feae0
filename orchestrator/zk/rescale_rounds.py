"""The record of each hot rescale of a run, as the console and operators read it.

Owns ``runs/<run>/adjust/<version>/``: the plan and state the control side wrote
(``plan``, ``state``), one graph-state update per instance (``updates/<instance>``) and
the tails' reports (``tails/<instance>``, docs/spec/hot-rescale.md step 4). The
protocol itself runs on the ledger (``orchestrator.rescale``); these znodes follow it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from kazoo.exceptions import NodeExistsError

from orchestrator.zk.session import encode
from orchestrator.zk.znodes import Znodes, check_name


class RescaleZnodes(Znodes):
    def adjust_path(self, run: str, epoch: int) -> str:
        """Folder of the hot-rescale round of ``epoch`` (the protocol lives elsewhere)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        return f"{self._folder(run, 'adjust')}/{epoch}"

    def write_adjustment(
        self, run: str, version: int, steps: Mapping[str, Mapping[str, Any]], under: str = ""
    ) -> None:
        """Write steps of adjustment ``version`` (``plan``, ``state``; with ``under=
        "updates"`` one graph-state update per instance) under ``adjust/<version>/``."""
        folder = self.adjust_path(run, version)
        if under:
            folder = f"{folder}/{check_name('folder', under)}"
        self._upsert_many(folder, steps)

    def report_tail(self, run: str, version: int, instance: str, report: Mapping[str, Any]) -> None:
        """A tail of the adjustment's subgraph has every marker (hot-rescale.md step 4)."""
        path = f"{self.adjust_path(run, version)}/tails/{check_name('node', instance)}"
        with contextlib.suppress(NodeExistsError):
            self.client.retry(self.client.create, path, encode(report), makepath=True)

    def adjustment_tails(self, run: str, version: int) -> set[str]:
        return set(self._children(f"{self.adjust_path(run, version)}/tails"))

    def read_adjustment(self, run: str, version: int) -> dict[str, dict[str, Any]]:
        return self._read_all(self.adjust_path(run, version))
