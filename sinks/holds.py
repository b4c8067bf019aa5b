"""The legal holds in Cassandra (``core.holds.Holds``): one partition per scope, ``KIND:ID``, its hold in static
columns (why, by whom, since when) and, as rows, the candidates found held under it, each with the rule it was
due under, which the release sends back to the stream as rechecks.

One table of the purger's own, in the configured keyspace (``cassandra.holds_table``); ``purger setup`` creates
it, and a platform may write it too (docs/operations.md, "Legal holds"): a hold is in force once its static
``reason`` is set. Every write that decides (a hold placed, a candidate kept, a hold released) is a lightweight
transaction on the scope's partition, committed at QUORUM, and the purges read it at QUORUM: a hold placed
before a read began is seen, from any data centre, and a candidate is kept under the hold it read only while
that hold still stands, so a release never misses one.

Example::

    holds = CassandraHolds.of(session, config.cassandra)   # cassandra.holds_table
    holds.place("mailbox:alice", "case 42", "jdoe")   # None, or the hold already in force
    holds.held(["message:m1", "mailbox:alice"])        # Hold(scope='mailbox:alice', reason='case 42', ...)
    holds.release("mailbox:alice")                     # [('message', 'm1', 'expired_by_date'), ...] to recheck
    holds.forget("mailbox:alice", kept)                # once they are rechecked
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cassandra import ConsistencyLevel
from cassandra.concurrent import execute_concurrent_with_args

from purger.connectors.cassandra_client import ROWS, own_profile
from purger.core.holds import Hold, Holds
from purger.core.times import epoch_ms, from_epoch_ms, now_ms

if TYPE_CHECKING:
    from purger.core.settings import CassandraConfig

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {keyspace}.{table} (
  scope      text,              -- KIND:ID: message:m1, mailbox:alice, user:u1
  kind       text,              -- a candidate found held under it, looked at again at the release
  object_id  text,
  rule       text,              -- the rule it was due under
  reason     text static,       -- set: the hold is in force
  placed_by  text static,
  placed_at  timestamp static,
  PRIMARY KEY ((scope), kind, object_id)
)
"""

# How many times ``place`` meets a hold another writer lifts before it reads it, before it gives up.
PLACE_ATTEMPTS = 5
HOLDS_COLUMNS = frozenset({"scope", "kind", "object_id", "rule", "reason", "placed_by", "placed_at"})


def holds_schema(keyspace: str, table: str) -> str:
    """The CQL that creates the holds table ``keyspace.table`` if it does not exist."""
    return _SCHEMA.format(keyspace=keyspace, table=table).strip()


class CassandraHolds(Holds):
    def __init__(self, session: Any, keyspace: str, table: str, serial_consistency: str) -> None:
        self.session = session
        self.name = name = f"{keyspace}.{table}"
        self.rows_profile = own_profile(session, ROWS)
        serial = ConsistencyLevel.name_to_value[serial_consistency]

        # QUORUM, across data centres, for every statement: a hold committed by ``place`` (or written by the
        # platform at QUORUM) is seen by every read that starts after, from any data centre, with no Paxos round
        # per candidate; the writes that must not cross a release are lightweight transactions.
        def prepare(cql: str) -> Any:
            statement = session.prepare(cql)
            statement.consistency_level = ConsistencyLevel.QUORUM
            statement.serial_consistency_level = serial
            return statement

        self.read = prepare(f"SELECT reason, placed_by, placed_at FROM {name} WHERE scope = ? LIMIT 1")
        self.rows = prepare(f"SELECT kind, object_id, rule FROM {name} WHERE scope = ?")
        self.every = prepare(f"SELECT scope, reason, placed_by, placed_at, kind FROM {name} PER PARTITION LIMIT 1")
        self.count = prepare(f"SELECT count(kind) FROM {name} WHERE scope = ?")
        self.add = prepare(f"UPDATE {name} SET reason = ?, placed_by = ?, placed_at = ? WHERE scope = ? "
                           "IF reason = null")
        self.kept = prepare(f"UPDATE {name} SET rule = ? WHERE scope = ? AND kind = ? AND object_id = ? "
                            "IF reason != null")
        self.lift = prepare(f"UPDATE {name} SET reason = null, placed_by = null, placed_at = null WHERE scope = ? "
                            "IF reason != null")
        self.forget_one = prepare(f"DELETE FROM {name} WHERE scope = ? AND kind = ? AND object_id = ?")

    @classmethod
    def of(cls, session: Any, cassandra: CassandraConfig) -> CassandraHolds:
        """The holds of a configuration's ``cassandra.holds_table``, read at its serial consistency."""
        return cls(session, cassandra.keyspace, cassandra.holds_table, cassandra.serial_consistency)

    def held(self, scopes: list[str]) -> Hold | None:
        # Every scope read at once, each from a replica of its own partition: a message's two scopes cost one
        # read's wait, not two (BENCHMARKS.md, "Cassandra requests per decision").
        reads = [self.session.execute_async(self.read, (scope,), execution_profile=self.rows_profile)
                 for scope in scopes]
        for scope, read in zip(scopes, reads):
            found = read.result().one()
            if found is not None and found.reason is not None:
                return Hold(scope, found.reason, found.placed_by or "", epoch_ms(found.placed_at))
        return None

    def keep(self, hold: Hold, kind: str, object_id: str, rule: str) -> bool:
        return self.session.execute(self.kept, (rule, hold.scope, kind, object_id)).was_applied

    def place(self, scope: str, reason: str, placed_by: str) -> Hold | None:
        """Place a hold on ``scope``: None once placed, or the hold already in force there (left as it is)."""
        for _ in range(PLACE_ATTEMPTS):
            if self.session.execute(self.add, (reason, placed_by, from_epoch_ms(now_ms()), scope)).was_applied:
                return None
            # Not applied: the answer holds only the column of the condition (``reason``); the rest is read. A hold
            # lifted in between is placed again.
            there = self.held([scope])
            if there is not None:
                return there
        raise RuntimeError(f"hold on {scope}: placed and lifted by others {PLACE_ATTEMPTS} times while this one was "
                           "placed; run `purger hold` again")

    def release(self, scope: str) -> list[tuple[str, str, str]] | None:
        """Lift the hold on ``scope``: the candidates kept under it (kind, id, rule), to recheck, then ``forget``;
        None when no hold stood there and none is kept (a release cut short before its ``forget`` leaves them, and
        running it again finds them). Once the hold is lifted no candidate is kept under it any more (``keep`` is
        conditioned on it), so the rows read after are every one there is."""
        lifted = self.session.execute(self.lift, (scope,)).was_applied
        found = [(row.kind, row.object_id, row.rule) for row in self.session.execute(self.rows, (scope,))
                 if row.kind is not None]
        return found if lifted or found else None

    def forget(self, scope: str, kept: list[tuple[str, str, str]]) -> None:
        """Remove the candidates ``release`` returned, once rechecked."""
        execute_concurrent_with_args(self.session, self.forget_one,
                                     [(scope, kind, object_id) for kind, object_id, _ in kept],
                                     raise_on_first_error=True)

    def in_force(self) -> list[tuple[Hold, int]]:
        """Every hold in force, each with how many candidates are kept under it (a scan: holds are few)."""
        holds = [Hold(row.scope, row.reason, row.placed_by or "", epoch_ms(row.placed_at))
                 for row in self.session.execute(self.every) if row.reason is not None]
        return [(hold, self.session.execute(self.count, (hold.scope,)).one()[0])
                for hold in sorted(holds, key=lambda hold: hold.scope)]

    def releases_cut_short(self) -> list[tuple[str, int]]:
        """The scopes whose hold a release lifted and that still keep candidates: a release stopped before it
        sent their rechecks (``release`` again sends them), with how many (a scan: holds are few)."""
        scopes = sorted(row.scope for row in self.session.execute(self.every)
                        if row.reason is None and row.kind is not None)
        return [(scope, self.session.execute(self.count, (scope,)).one()[0]) for scope in scopes]
