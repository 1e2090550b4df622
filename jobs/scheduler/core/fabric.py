"""Which nodes of one pool the replicas of a gang may share: a gang across hosts needs a network that spans them.

A Docker gang whose replicas run on several nodes talks over an overlay
network of its own, which only a Docker swarm provides, and only a swarm
manager can make (docs/gangs.md). So its nodes must all be in one swarm, and
one of them must be a manager of it. Each node says where it stands
(`model.Node.fabric`): None for a node that needs no such network (the
process and simulated runtimes: their gangs span any nodes), "" for a
Docker node in no swarm (its gangs stay on that node), or its swarm's key.

`Fabrics` answers whether a set of nodes may hold one gang, and which groups
of nodes to search when the pool-wide best fit spread a gang over nodes
that may not share it: the nodes of each swarm with a manager (by key), the
nodes that need no swarm, then (`alone`) single nodes with room for the
whole gang, the fewest free GPUs first (best fit).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from jobs.scheduler.core.model import Node


class Fabrics:
    """The fabric of each node of one pool, by node number (the pool's nodes sorted by name)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.of: tuple[str | None, ...] = tuple(node.fabric for node in nodes)
        # Whether any gang of the pool is limited at all: the common cases (all simulated, all process) skip every
        # check below.
        self.restricted = any(fabric is not None for fabric in self.of)
        self.managers = frozenset(number for number, node in enumerate(nodes) if node.fabric and node.fabric_manager)
        members: dict[str, set[int]] = {}
        for number, fabric in enumerate(self.of):
            if fabric:
                members.setdefault(fabric, set()).add(number)
        everyone = frozenset(range(len(self.of)))
        # For each swarm with a manager in the pool (by key): the nodes outside it, and its managers.
        self._swarms = tuple(
            (everyone - members[key], frozenset(members[key] & self.managers))
            for key in sorted(members)
            if members[key] & self.managers
        )
        unbound = frozenset(number for number, fabric in enumerate(self.of) if fabric is None)
        self._outside_unbound = everyone - unbound if unbound and self.restricted else None
        self._everyone = everyone

    def may_share(self, numbers: set[int]) -> bool:
        """Return whether the nodes `numbers` may hold the replicas of one gang together.

        One node always may; several may when none needs a swarm, or when
        all are in one swarm and one of them is its manager (that replica
        makes the gang's network).
        """
        if not self.restricted or len(numbers) <= 1:
            return True
        fabrics = {self.of[number] for number in numbers}
        if len(fabrics) != 1:
            return False
        (fabric,) = fabrics
        return fabric is None or (fabric != "" and not numbers.isdisjoint(self.managers))

    def swarms(self, excluded: frozenset[int]) -> Iterator[tuple[frozenset[int], frozenset[int]]]:
        """Yield (the nodes to exclude so that a search stays inside, its managers not excluded) for each swarm."""
        for outside, managers in self._swarms:
            usable = managers - excluded
            if usable:
                yield outside | excluded, usable

    def unbound(self, excluded: frozenset[int]) -> frozenset[int] | None:
        """Return the nodes to exclude so that a search stays on nodes that need no swarm; None when there are none."""
        return None if self._outside_unbound is None else self._outside_unbound | excluded

    def outside(self, numbers: frozenset[int]) -> frozenset[int]:
        """Return the pool's nodes but `numbers`: what a search excludes to stay on them."""
        return self._everyone - numbers

    def alone(self, number: int, excluded: frozenset[int]) -> frozenset[int]:
        """Return the nodes to exclude from a search so that it stays on node `number`."""
        return self.outside(frozenset((number,))) | excluded
