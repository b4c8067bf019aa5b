"""Legal holds on memory (``core.holds.Holds``), for the protocol's tests that run without Cassandra: the holds by
scope and what each keeps, as ``sinks.holds.CassandraHolds`` keeps them."""

from __future__ import annotations

from purger.core.holds import Hold, Holds


class MemoryHolds(Holds):
    def __init__(self) -> None:
        self.placed: dict[str, Hold] = {}
        self.kept: dict[str, set[tuple[str, str, str]]] = {}
        self.reads = 0

    def place(self, scope: str, why: str = "case 42") -> None:
        self.placed[scope] = Hold(scope, why, "test", 0)

    def release(self, scope: str) -> set[tuple[str, str, str]]:
        del self.placed[scope]
        return self.kept.pop(scope, set())

    def held(self, scopes: list[str]) -> Hold | None:
        self.reads += bool(scopes)
        return next((self.placed[scope] for scope in scopes if scope in self.placed), None)

    def keep(self, hold: Hold, kind: str, object_id: str, rule: str) -> bool:
        if hold.scope not in self.placed:
            return False
        self.kept.setdefault(hold.scope, set()).add((kind, object_id, rule))
        return True
