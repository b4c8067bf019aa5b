"""A table read whole, by token range, with the Python driver: what a Spark task of a reconcile scan runs.

No Spark 4 build of the Cassandra connector exists, so the scan is the connector's idea done by hand:
the driver's token map gives the ring; each range between two nodes' tokens is split into equal
sub-ranges, enough for every task to take several; a task reads its sub-ranges one after the other
with ``token(key) > ? AND token(key) <= ?``, page by page. Murmur3 tokens only (Cassandra's default
partitioner since 1.2).

Example::

    ranges = token_ranges(session, count=64)                # [(start, end], ...] covering the ring
    key = partition_key(session, "mailbox", "messages")     # ['message_id']
    for row in scan_ranges(session, "mailbox", "messages", key, ["message_id", "created_at"], ranges[:4],
                           consistency="LOCAL_QUORUM", page_size=1000):
        ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from purger.connectors import cassandra_session
from purger.core.config import CassandraConfig

if TYPE_CHECKING:
    from cassandra.cluster import Session

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


def scan_plan(config: CassandraConfig, table: str, count: int) -> tuple[list[str], list[tuple[int, int]]]:
    """What a scan of ``table`` (in ``config.keyspace``) needs before its tasks start, read through a
    short-lived session: the table's partition key and at least ``count`` token ranges. ``LookupError``
    naming the table when it does not exist."""
    session = cassandra_session(config)
    try:
        return partition_key(session, config.keyspace, table), token_ranges(session, count)
    finally:
        session.cluster.shutdown()


def scan_ranges(session: "Session", keyspace: str, table: str, key: list[str], columns: list[str],
                ranges: list[tuple[int, int]], consistency: str, page_size: int) -> Iterator[dict[str, Any]]:
    """Every row of the table in ``ranges``, as column -> value, paged (``page_size`` rows a request) at
    ``consistency``. Rows come as the pages do: nothing is held beyond one page."""
    from cassandra import ConsistencyLevel

    token = f"token({', '.join(key)})"
    statement = session.prepare(
        f"SELECT {', '.join(columns)} FROM {keyspace}.{table} WHERE {token} > ? AND {token} <= ?")
    statement.consistency_level = ConsistencyLevel.name_to_value[consistency]
    statement.fetch_size = page_size
    for start, end in ranges:
        result = session.execute(statement, (start, end))
        names = result.column_names
        for row in result:  # the session's rows are named tuples
            yield dict(zip(names, row))
