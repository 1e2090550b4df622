"""The one helper every state machine uses: a table of allowed moves, checked wherever a state changes.

Each app's `choices.py` declares its lifecycle as a `Transitions` over its
`TextChoices` states; services move rows with `move` (a compare-and-swap
UPDATE checked against the table) or, where the UPDATE is built by hand,
call `check` first. A move the table forbids raises `ForbiddenTransition`:
that is a bug in the caller, never a race (a race shows as a row count of 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from django.db.models import QuerySet, TextChoices

S = TypeVar("S", bound=TextChoices)


class ForbiddenTransition(ValueError):
    """A state change the machine's table does not allow."""

    def __init__(self, machine: str, current: str, target: str) -> None:
        super().__init__(f"{machine}: cannot go from {current} to {target}")
        self.machine = machine
        self.current = current
        self.target = target


class Transitions(Mapping[S, frozenset[S]], Generic[S]):
    """A state machine's table: for each state, the states it may move to (read as a mapping).

    The table must name every state of `states` once and move only to
    states of `states`; anything else raises ValueError when the table is
    built (at import), so a typo cannot wait for the first move to show.
    """

    def __init__(self, name: str, states: type[S], table: Mapping[S, Iterable[S]]) -> None:
        self.name = name
        self._states = states
        self._table: dict[S, frozenset[S]] = {states(key): frozenset(map(states, to)) for key, to in table.items()}
        known = frozenset(states)
        if set(self._table) != known:
            raise ValueError(f"{name}: the table must list every state once, not {sorted(self._table)}")

    def __getitem__(self, state: S) -> frozenset[S]:
        return self._table[self._states(state)]

    def __iter__(self) -> Iterator[S]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def allows(self, current: str, target: str) -> bool:
        """Return whether the table allows `current` -> `target`; raises ValueError for an unknown state."""
        return self._states(target) in self._table[self._states(current)]

    def check(self, current: str, target: str) -> S:
        """Return `target` as a state when `current` may move to it; raises ForbiddenTransition otherwise."""
        if not self.allows(current, target):
            raise ForbiddenTransition(self.name, str(current), str(target))
        return self._states(target)

    def check_all(self, sources: Iterable[str], target: str) -> tuple[S, list[S]]:
        """Return the target and the sources as states when every source may reach `target`; raises
        ForbiddenTransition naming the first source that may not."""
        listed = [self._states(source) for source in sources]
        for source in listed:
            self.check(source, target)
        return self._states(target), listed

    def move(self, rows: QuerySet[Any], *, from_states: Iterable[str], to_state: str, **fields: Any) -> int:
        """Compare-and-swap: set `to_state` (and `fields`) on the `rows` still in one of `from_states`; return
        how many moved (0 when another got there first). Raises ForbiddenTransition before touching a row
        when a source state may not reach `to_state`."""
        target, sources = self.check_all(from_states, to_state)
        return rows.filter(state__in=sources).update(state=target, **fields)

    def terminal(self) -> frozenset[S]:
        """Return the states with no way out."""
        return frozenset(state for state, targets in self._table.items() if not targets)

    def reachable_from(self, start: str) -> frozenset[S]:
        """Return every state some sequence of moves reaches from `start` (`start` itself only through a cycle)."""
        seen: set[S] = set()
        todo = list(self._table[self._states(start)])
        while todo:
            state = todo.pop()
            if state not in seen:
                seen.add(state)
                todo.extend(self._table[state])
        return frozenset(seen)
