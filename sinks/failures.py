"""The objects whose purge fails, in Cassandra (``core.handles.Failures``): per object, its failures in a row,
since when, the last error and the day its error was last recorded, read and written only when its purge fails,
so a purge that goes through costs nothing here. Each failure backs the next attempt off (``core.retries``):
``stream.retry_interval``, doubled at each failure, to ``stream.retry_cap``; one error record a day.

One table of the purger's own, in the configured keyspace (``cassandra.failures_table``); ``purger setup``
creates it. A row expires ``FAILURES_TTL_S`` after the object's last failure: those failing now are few, and
``purger status`` lists those failing for long (``stuck``).

Example::

    failures = CassandraFailures.of(session, config)
    failures.failed("payload", "p1", "dc3: no store configured")   # Retry(at_ms=..., record=True, failures=1)
    failures.stuck(now_ms(), longer_than_ms=3_600_000)               # [Stuck('payload', 'p1', 7, ...)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from purger.core.handles import Failures, Retry
from purger.core.retries import Failing, failed_again
from purger.core.times import duration_ms, epoch_ms, from_epoch_ms, now_ms

if TYPE_CHECKING:
    from purger.core.settings import PurgerConfig

FAILURES_TTL_S = 7 * 24 * 3600
# Failing for longer than this: stuck (``purger status``, ``purger_objects_stuck``, PurgerObjectsStuck).
STUCK_AFTER_MS = 3_600_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {keyspace}.{table} (
  kind            text,
  object_id       text,
  failures        int,        -- in a row
  first_failed_at timestamp,
  last_failed_at  timestamp,
  recorded_on     date,       -- the day (UTC) its error last went to the ledger
  error           text,       -- the last one
  PRIMARY KEY ((kind, object_id))
) WITH default_time_to_live = %d
""" % FAILURES_TTL_S

FAILURES_COLUMNS = frozenset({"kind", "object_id", "failures", "first_failed_at", "last_failed_at", "recorded_on",
                              "error"})


def failures_schema(keyspace: str, table: str) -> str:
    """The CQL that creates the failures table ``keyspace.table`` if it does not exist."""
    return _SCHEMA.format(keyspace=keyspace, table=table).strip()


@dataclass(frozen=True)
class Stuck:
    """An object failing for long: its kind and id, its failures in a row, since when, and its last error."""

    kind: str
    id: str
    failures: int
    since_ms: int
    error: str


class CassandraFailures(Failures):
    def __init__(self, session: Any, keyspace: str, table: str, retry_ms: int, cap_ms: int) -> None:
        self.session = session
        self.retry_ms, self.cap_ms = retry_ms, cap_ms
        name = f"{keyspace}.{table}"
        self.read = session.prepare(f"SELECT failures, first_failed_at, last_failed_at, recorded_on FROM {name} "
                                    "WHERE kind = ? AND object_id = ?")
        self.write = session.prepare(f"INSERT INTO {name} (kind, object_id, failures, first_failed_at, last_failed_at, "
                                     "recorded_on, error) VALUES (?, ?, ?, ?, ?, ?, ?)")
        self.every = session.prepare(f"SELECT kind, object_id, failures, first_failed_at, last_failed_at, error "
                                     f"FROM {name}")

    @classmethod
    def of(cls, session: Any, config: PurgerConfig) -> CassandraFailures:
        """The failures of a configuration's ``cassandra.failures_table``, backed off as its ``stream`` says."""
        return cls(session, config.cassandra.keyspace, config.cassandra.failures_table,
                   duration_ms(config.stream.retry_interval), duration_ms(config.stream.retry_cap))

    def failed(self, kind: str, object_id: str, error: str) -> Retry:
        now = now_ms()
        found = self.session.execute(self.read, (kind, object_id)).one()
        before = None if found is None else Failing(found.failures, epoch_ms(found.first_failed_at),
                                                    epoch_ms(found.last_failed_at), _day(found.recorded_on))
        failing, retry = failed_again(before, now, self.retry_ms, self.cap_ms)
        self.session.execute(self.write, (kind, object_id, failing.failures, from_epoch_ms(failing.first_ms),
                                          from_epoch_ms(failing.last_ms), failing.recorded_on, error[:1000]))
        return retry

    def stuck(self, at_ms: int, longer_than_ms: int, limit: int = 10_000) -> list[Stuck]:
        """The objects failing now (within a backoff at the cap) for longer than ``longer_than_ms``, longest first,
        from at most ``limit`` rows of the table (a scan: the rows are those that failed in the last week)."""
        found = []
        for scanned, row in enumerate(self.session.execute(self.every)):
            if scanned >= limit:
                break
            first, last = epoch_ms(row.first_failed_at), epoch_ms(row.last_failed_at)
            if at_ms - last <= 2 * self.cap_ms + self.retry_ms and at_ms - first > longer_than_ms:
                found.append(Stuck(row.kind, row.object_id, row.failures, first, row.error or ""))
        return sorted(found, key=lambda stuck: stuck.since_ms)


def _day(value: Any) -> Any:
    """A ``date`` column as the driver returns it (its own ``Date``) -> ``datetime.date``."""
    return value.date() if value is not None and hasattr(value, "date") else value
