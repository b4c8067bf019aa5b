"""A table read whole, by token range, with the Python driver: what a Spark task of a reconcile scan runs.

No Spark 4 build of the Cassandra connector exists, so the scan is the connector's idea done by hand:
the driver's token map gives the ring; each range between two nodes' tokens is split into equal
sub-ranges, enough for every task to take several; a task reads its sub-ranges one after the other
with ``token(key) > ? AND token(key) <= ?``, page by page, each page sent to a replica of its range.
Murmur3 tokens only (Cassandra's default partitioner since 1.2).

A ``timestamp`` column is read as its milliseconds (``blobAsBigint(timestampAsBlob(c))``) and made a
``datetime`` here, as the driver would: a value outside the years a ``datetime`` holds (1-9999), which the
driver fails the whole page on (and drops its connection), skips that row with a warning naming its key, and
the scan goes on.

Example::

    ranges = token_ranges(session, count=64)                # [(start, end], ...] covering the ring
    key = partition_key(session, "mailbox", "messages")     # ['message_id']
    for row in scan_ranges(session, "mailbox", "messages", key, ["message_id", "created_at"], ranges[:4],
                           consistency="LOCAL_QUORUM", page_size=1000):
        ...
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from purger.connectors import cassandra_session
from purger.core.settings import CassandraConfig, ReconcileConfig
from purger.core.reconcile_descriptors import REFERENCED_FIELD

if TYPE_CHECKING:
    from cassandra.cluster import ResultSet, Session
    from cassandra.pool import Host

log = logging.getLogger(__name__)

MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1


def split_ring(ring: list[int], count: int) -> list[tuple[int, int]]:
    """At least ``count`` ranges ``(start, end]`` covering the Murmur3 ring exactly once, none crossing a
    node's token (each range has one set of replicas).

    >>> split_ring([0], 4)
    [(-9223372036854775808, -4611686018427387904), (-4611686018427387904, 0), (0, 4611686018427387903), (4611686018427387903, 9223372036854775807)]
    """
    bounds = sorted(set(ring))
    edges = [MIN_TOKEN, *(t for t in bounds if MIN_TOKEN < t < MAX_TOKEN), MAX_TOKEN]
    spans = list(zip(edges, edges[1:]))
    per_span = max(1, -(-count // len(spans)))
    ranges = []
    for start, end in spans:
        step = (end - start) // per_span
        cuts = [start + step * i for i in range(per_span)] + [end]
        ranges += [(a, b) for a, b in zip(cuts, cuts[1:]) if a < b]
    return ranges


def token_ranges(session: "Session", count: int) -> list[tuple[int, int]]:
    """The cluster's ring (its nodes' tokens, from the driver's token map) split into at least ``count``
    ranges."""
    token_map = session.cluster.metadata.token_map
    ring = [token.value for token in token_map.ring] if token_map is not None else []
    return split_ring(ring, count)


def partition_key(session: "Session", keyspace: str, table: str) -> list[str]:
    """The table's partition key columns, from the cluster's schema; ``LookupError`` naming the table
    when it does not exist."""
    tables = session.cluster.metadata.keyspaces.get(keyspace)
    found = tables.tables.get(table) if tables is not None else None
    if found is None:
        raise LookupError(f"table {keyspace}.{table} does not exist")
    return [column.name for column in found.partition_key]


@dataclass(frozen=True)
class ScanPlan:
    """A scan's partition key, and its token ranges to read in ``tasks`` Spark tasks (consecutive ranges each)."""

    key: list[str]
    ranges: list[tuple[int, int]]
    tasks: int


def scan_plan(config: CassandraConfig, table: str, cores: int, settings: ReconcileConfig) -> ScanPlan:
    """What a scan of ``table`` (in ``config.keyspace``) needs before its tasks start, read through a
    short-lived session: the table's partition key, and ``settings.tasks_per_core`` tasks per core of
    ``settings.ranges_per_task`` token ranges each. ``LookupError`` naming the table when it does not exist."""
    session = cassandra_session(config)
    try:
        key = partition_key(session, config.keyspace, table)
        ranges = token_ranges(session, cores * settings.tasks_per_core * settings.ranges_per_task)
    finally:
        session.cluster.shutdown()
    return ScanPlan(key, ranges, max(1, len(ranges) // settings.ranges_per_task))


def scan_ranges(session: "Session", keyspace: str, table: str, key: list[str], columns: list[str],
                ranges: list[tuple[int, int]], consistency: str, page_size: int,
                referenced_by: str | None = None) -> Iterator[dict[str, Any]]:
    """Every row of the table in ``ranges``, as column -> value (``scan_pages``, a row at a time)."""
    for names, rows in scan_pages(session, keyspace, table, key, columns, ranges, consistency, page_size,
                                  referenced_by):
        for row in rows:
            yield dict(zip(names, row))


def scan_pages(session: "Session", keyspace: str, table: str, key: list[str], columns: list[str],
               ranges: list[tuple[int, int]], consistency: str, page_size: int,
               referenced_by: str | None = None) -> Iterator[tuple[list[str], list[tuple[Any, ...]]]]:
    """Every row of the table in ``ranges``, a page at a time (``page_size`` rows a request, at
    ``consistency``): the columns' names, and the page's rows as tuples of values in that order. Nothing is
    held beyond the page and the one read ahead (``_pages``).

    With ``referenced_by``, a table partitioned by the same key, each row ends with ``referenced``: whether
    that table holds a partition for the row's key. Its partition keys in the same range are read beside
    the rows, both in token order, and merged: nothing is held beyond a page of each."""
    from cassandra import ConsistencyLevel

    token = f"token({', '.join(key)})"

    def prepared(cql: str) -> Any:
        statement = session.prepare(f"{cql} WHERE {token} > ? AND {token} <= ?")
        statement.consistency_level = ConsistencyLevel.name_to_value[consistency]
        statement.fetch_size = page_size
        return statement

    timestamps = _timestamp_columns(session, keyspace, table, columns)
    selected = ", ".join(f"blobAsBigint(timestampAsBlob({c})) AS {c}" if c in timestamps else c for c in columns)
    decoded = _Decoder(f"{keyspace}.{table}", columns, key, timestamps)
    if referenced_by is None:
        select = prepared(f"SELECT {selected} FROM {keyspace}.{table}")
        for page in _pages(session, keyspace, select, ranges):
            yield page.column_names, decoded.rows(page.current_rows)
        return
    select = prepared(f"SELECT {token} AS scan_token, {selected} FROM {keyspace}.{table}")
    referring = prepared(f"SELECT DISTINCT {token} AS scan_token, {', '.join(key)} FROM {keyspace}.{referenced_by}")
    for start, end in ranges:
        references = _KeysByToken(row for page in _pages(session, keyspace, referring, [(start, end)])
                                  for row in page.current_rows)
        for page in _pages(session, keyspace, select, [(start, end)]):
            names = page.column_names[1:]
            at = [names.index(column) for column in key]
            yield [*names, REFERENCED_FIELD], [
                (*values, tuple(values[i] for i in at) in references.at(scan_token))
                for scan_token, *values in decoded.rows(page.current_rows, offset=1)]


def _timestamp_columns(session: "Session", keyspace: str, table: str, columns: list[str]) -> frozenset[str]:
    """Those of ``columns`` whose type is ``timestamp``, from the cluster's schema."""
    found = session.cluster.metadata.keyspaces[keyspace].tables[table].columns
    return frozenset(c for c in columns if c in found and found[c].cql_type == "timestamp")


class _Decoder:
    """A page's rows with their timestamp columns, read as milliseconds, made ``datetime`` values as the driver
    makes them (``cassandra.util.datetime_from_timestamp``); a row with one outside 1-9999 left out, logged."""

    def __init__(self, table: str, columns: list[str], key: list[str], timestamps: frozenset[str]) -> None:
        self.table, self.columns = table, columns
        self.at = [i for i, c in enumerate(columns) if c in timestamps]
        self.key = [i for i, c in enumerate(columns) if c in key] or [0]

    def rows(self, rows: list[tuple[Any, ...]], offset: int = 0) -> list[tuple[Any, ...]]:
        """``rows`` decoded; ``offset``: the columns before ``columns`` in each (a scan token)."""
        if not self.at:
            return rows
        from cassandra.util import datetime_from_timestamp

        decoded = []
        for row in rows:
            values = list(row)
            try:
                for i in self.at:
                    millis = values[offset + i]
                    if millis is not None:
                        values[offset + i] = datetime_from_timestamp(millis / 1000.0)
            except (OverflowError, ValueError):
                key = ", ".join(f"{self.columns[k]}={values[offset + k]!r}" for k in self.key)
                log.warning("scan of %s: row %s skipped: its %s is %d ms from 1970, outside the years 1-9999 a "
                            "timestamp can be read in; correct or delete the row", self.table, key,
                            self.columns[i], millis)
                continue
            decoded.append(tuple(values))
        return decoded


def _pages(session: "Session", keyspace: str, statement: Any, ranges: list[tuple[int, int]]) -> Iterator["ResultSet"]:
    """The pages of ``statement`` over each range ``(start, end]`` in turn, one request each, sent to a replica of
    its range. The request for the next page (or the next range's first) goes out before a page is handed on, so
    that Cassandra reads it while the caller works on this one: two pages at most are held.

    A statement bound to token bounds has no partition key for the session's token-aware policy to route by, and
    cassandra-driver 3.30 takes no token in its place, so the replica is named to the request (``host``); that
    disables the driver's failover to another node, so when the replica stops answering, the rest of the range
    goes through the load-balancing policy, from the page it had reached."""
    from cassandra.cluster import NoHostAvailable

    def send(start: int, end: int, replica: "Host | None", paging_state: bytes | None) -> tuple[Any, ...]:
        future = session.execute_async(statement, (start, end), paging_state=paging_state, host=replica)
        return start, end, replica, paging_state, future

    todo = iter(ranges)

    def next_range() -> tuple[Any, ...] | None:
        found = next(todo, None)
        return None if found is None else send(*found, _local_replica(session, keyspace, found[1]), None)

    pending = next_range()
    while pending is not None:
        start, end, replica, paging_state, future = pending
        try:
            page = future.result()
        except NoHostAvailable:
            if replica is None:
                raise
            pending = send(start, end, None, paging_state)
            continue
        pending = next_range() if page.paging_state is None else send(start, end, replica, page.paging_state)
        yield page


def _local_replica(session: "Session", keyspace: str, end: int) -> "Host | None":
    """A replica of the range ending at ``end`` that is up and in the session's local data centre, drawn at
    random so that a scan spreads over the replicas; None when there is none (the session's policy then
    picks a node). A range of ``split_ring`` crosses no node's token, so its replicas are those of its end."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT
    from cassandra.policies import HostDistance

    token_map = session.cluster.metadata.token_map
    if token_map is None:
        return None
    policy = session.get_execution_profile(EXEC_PROFILE_DEFAULT).load_balancing_policy
    local = [host for host in token_map.get_replicas(keyspace, token_map.token_class(end))
             if host.is_up and policy.distance(host) == HostDistance.LOCAL]
    return random.choice(local) if local else None


class _KeysByToken:
    """Partition keys read in token order, asked for in token order: ``at(token)`` is the set of keys with
    that token (two keys may share one), those before it dropped."""

    def __init__(self, rows: Iterable[tuple[Any, ...]]) -> None:
        self._groups = groupby(rows, key=lambda row: row[0])
        self._token: int | None = None
        self._keys: set[tuple[Any, ...]] = set()

    def at(self, token: int) -> set[tuple[Any, ...]]:
        while self._token is None or self._token < token:
            group = next(self._groups, None)
            if group is None:
                self._token, self._keys = MAX_TOKEN + 1, set()
                break
            self._token, self._keys = group[0], {tuple(row[1:]) for row in group[1]}
        return self._keys if self._token == token else set()
