"""The sessions' rows: the purger's own reads get the driver's named tuples with each statement's row class made
once; the default profile keeps the driver's rows."""

from __future__ import annotations

import uuid

import pytest
from cassandra.query import named_tuple_factory

from purger.connectors.cassandra_client import named_rows

COLUMNS = [
    ["message_id", "mailbox", "payload_id"],
    ["[applied]", "message_id", "purging"],  # a lightweight transaction's answer
    ["writetime(updated_at)", "ttl(state)", "count"],  # names the driver cleans
    ["system.json"],
    ["a"] * 2,  # the same name twice: the driver renames
]


@pytest.mark.parametrize("columns", COLUMNS, ids=lambda columns: ",".join(columns))
def test_each_row_is_the_drivers_named_tuple_and_its_class_is_made_once(columns):
    rows = [tuple(f"{column}-{n}" for column in columns) for n in range(3)]
    ours, drivers = named_rows(columns, rows), named_tuple_factory(columns, rows)
    assert [(r._fields, tuple(r)) for r in ours] == [(r._fields, tuple(r)) for r in drivers]
    assert type(named_rows(list(columns), rows[:1])[0]) is type(ours[0])  # the same class for the next response
    assert named_rows(columns, []) == []


def test_the_purgers_statements_take_its_rows_and_the_default_profile_keeps_the_drivers(config):
    """On the real server: ``CassandraTables`` reads named tuples of one class per statement and tells a
    lightweight transaction applied or not; the session's default profile keeps the driver's own rows, on which
    ``ResultSet.was_applied`` works, as code given a purger's session (a platform's, a policy's) uses it; and
    ``CassandraTables`` on a session made elsewhere answers alike, through that session's default profile."""
    from cassandra.cluster import Cluster

    from purger.connectors import CassandraTables, cassandra_session

    table = f"row_factory_{uuid.uuid4().hex[:8]}"
    session = cassandra_session(config.cassandra, config.cassandra.keyspace)
    try:
        session.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v int)", timeout=60)
        tables = CassandraTables(session, config.cassandra.keyspace, {"t": table})
        insert, read = (tables.prepare("INSERT INTO {t} (k, v) VALUES (?, ?) IF NOT EXISTS"),
                        tables.prepare("SELECT k, v FROM {t} WHERE k = ?"))
        assert tables.applied(insert, "a", 1) and not tables.applied(insert, "a", 2)
        first, again = tables.one(read, "a"), tables.one(read, "a", serial=True)
        assert (first.k, first.v) == ("a", 1) and type(again) is type(first)
        assert [tuple(row) for row in tables.all(read, "a")] == [("a", 1)]
        assert session.execute(insert, ("a", 3)).was_applied is False
        assert session.execute(insert, ("b", 3)).was_applied is True
        assert session.execute(read, ("b",)).one()._asdict() == {"k": "b", "v": 3}
        # A session made by hand, with the driver's defaults (as a test or a platform makes one): the same answers.
        by_hand = Cluster(config.cassandra.hosts, port=config.cassandra.port, protocol_version=5).connect()
        try:
            theirs = CassandraTables(by_hand, config.cassandra.keyspace, {"t": table})
            assert not theirs.applied(theirs.prepare("INSERT INTO {t} (k, v) VALUES (?, ?) IF NOT EXISTS"), "a", 4)
            assert tuple(theirs.one(theirs.prepare("SELECT k, v FROM {t} WHERE k = ?"), "b")) == ("b", 3)
        finally:
            by_hand.cluster.shutdown()
    finally:
        session.execute(f"DROP TABLE IF EXISTS {table}", timeout=60)
        session.cluster.shutdown()
