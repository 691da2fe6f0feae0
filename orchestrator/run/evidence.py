"""Why the balancer acted: the observation an action was decided on, kept with its event.

Each tick the balancer decides from what it observed and from its own state (the
thresholds a node is judged by, the pacing it set before). An action's event keeps,
beside what it changed (the action's fields), those inputs for every node the action
names: its level and buffered bytes, rates in and out, watermarks, flag, rate
coefficient and speed, as they were *before* the decision. So an operator reading
"flag set" can check the level against the high water it was judged by, and a migration
against the levels of the branches it chose between (its scores are the action's own).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from balancer.model import NodeState

# Fields of an action that are prose or labels, never node names.
_NOT_NODES = {"kind", "reason", "signal"}


def observed_for(action: Mapping[str, Any], seen: Mapping[str, NodeState]) -> dict[str, NodeState]:
    """The states in ``seen`` of the nodes an action (as JSON) names, in any field: a
    node, an upstream, a branch's nodes, the keys of its shares or scores."""
    return {name: seen[name] for name in sorted(set(_names(action)) & set(seen))}


def _names(value: Any, field: str = "") -> Iterator[str]:
    if field in _NOT_NODES:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not field:  # the action's own fields: their names are not nodes
                yield from _names(item, str(key))
            else:
                yield str(key)
                yield from _names(item, field)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _names(item, field)
