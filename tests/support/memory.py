"""The engine's Cassandra-backed handles on memory, for the protocol's tests that run without Cassandra: legal holds
(``core.holds.Holds``: by scope, and what each keeps, as ``sinks.holds.CassandraHolds`` keeps them) and failing
purges (``core.handles.Failures``: each object's ``core.retries.Failing``, as ``sinks.failures`` keeps it)."""

from __future__ import annotations

from purger.core.handles import Failures, Retry
from purger.core.holds import Hold, Holds
from purger.core.retries import Failing, failed_again
from purger.core.times import now_ms


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


class MemoryFailures(Failures):
    def __init__(self, retry_ms: int = 1_000, cap_ms: int = 60_000) -> None:
        self.retry_ms, self.cap_ms = retry_ms, cap_ms
        self.failing: dict[tuple[str, str], Failing] = {}

    def failed(self, kind: str, object_id: str, error: str) -> Retry:
        failing, retry = failed_again(self.failing.get((kind, object_id)), now_ms(), self.retry_ms, self.cap_ms)
        self.failing[(kind, object_id)] = failing
        return retry
