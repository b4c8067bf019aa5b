"""A reconcile scan over rows whose timestamps the driver cannot decode (SPEC 10.4), on the stack's Cassandra.

Cassandra keeps any 64-bit number of milliseconds in a ``timestamp``; Python's ``datetime`` holds the years 1 to
9999. The driver fails a whole page on one value outside them, and drops the connection it came on. The scan
(``purger.reconcile.token_ranges.scan_pages``, what every reconcile task reads with) skips that row with a warning
naming its key and goes on with the others, decoded exactly as the driver decodes them.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import contextmanager

import pytest
from cassandra import DriverException

from purger.connectors import cassandra_session
from purger.reconcile.token_ranges import MAX_TOKEN, MIN_TOKEN, partition_key, scan_pages

pytestmark = pytest.mark.integration

GOOD = {f"good-{n}": 1_700_000_000_000 + n for n in range(30)}
OUT_OF_RANGE = {"after-9999": 300_000_000_000_000, "before-1": -70_000_000_000_000}


@pytest.fixture(scope="module")
def table(config):
    """A keyspace of this module's own: ``rows`` (an id, a timestamp, a number) and ``refs`` partitioned by the
    same id (a row's "referenced"), holding every good row, one row with no timestamp and the two out of range."""
    keyspace = f"scan_ts_{uuid.uuid4().hex[:8]}"
    with own_session(config) as session:
        _write(session, keyspace)
    yield keyspace
    with own_session(config) as session:
        session.execute(f"DROP KEYSPACE {keyspace}")


def _write(session, keyspace: str) -> None:
    session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = {{'class': 'SimpleStrategy', "
                    f"'replication_factor': 1}}")
    session.execute(f"CREATE TABLE {keyspace}.rows (id text PRIMARY KEY, at timestamp, n int)")
    session.execute(f"CREATE TABLE {keyspace}.refs (id text, ref text, PRIMARY KEY (id, ref))")
    insert = session.prepare(f"INSERT INTO {keyspace}.rows (id, at, n) VALUES (?, ?, ?)")
    # Milliseconds as a bigint blob: the driver itself refuses to encode a datetime past 9999.
    raw = session.prepare(f"INSERT INTO {keyspace}.rows (id, at, n) VALUES (?, blobAsTimestamp(bigintAsBlob(?)), ?)")
    for n, (object_id, millis) in enumerate({**GOOD, **OUT_OF_RANGE}.items()):
        session.execute(raw, (object_id, millis, n))
        session.execute(f"INSERT INTO {keyspace}.refs (id, ref) VALUES (%s, 'r')", (object_id,))
    session.execute(insert, ("no-time", None, -1))


@contextmanager
def own_session(config):
    """A session of the test's own: the driver's failure drops the connection the page came on."""
    session = cassandra_session(config.cassandra)
    try:
        yield session
    finally:
        session.cluster.shutdown()


def test_the_driver_alone_fails_the_page(table, config):
    """The fault is real: a plain select of the table fails on the driver's decoding."""
    with own_session(config) as session, pytest.raises(DriverException, match="out of range"):
        list(session.execute(f"SELECT id, at FROM {table}.rows"))


@pytest.mark.parametrize("referenced_by", [None, "refs"])
def test_a_scan_skips_a_row_it_cannot_decode_naming_its_key_and_reads_the_rest_as_the_driver_does(
        table, config, caplog, referenced_by):
    keyspace = table
    with own_session(config) as own, caplog.at_level(logging.WARNING, logger="purger.reconcile.token_ranges"):
        key = partition_key(own, keyspace, "rows")
        scanned = {}
        for names, rows in scan_pages(own, keyspace, "rows", key, ["id", "at", "n"], [(MIN_TOKEN, MAX_TOKEN)],
                                      "ONE", 7, referenced_by):
            for row in rows:
                scanned[row[names.index("id")]] = row
        assert set(scanned) == {*GOOD, "no-time"}
        # Decoded as the driver decodes the same rows read one by one.
        by_driver = own.prepare(f"SELECT id, at, n FROM {keyspace}.rows WHERE id = ?")
        for object_id, row in scanned.items():
            assert row[:3] == tuple(own.execute(by_driver, (object_id,)).one())
            assert referenced_by is None or row[3] is (object_id != "no-time")
    warned = sorted(r.getMessage() for r in caplog.records)
    assert warned == sorted(
        f"scan of {keyspace}.rows: row id={object_id!r} skipped: its at is {millis} ms from 1970, outside the years "
        f"1-9999 a timestamp can be read in; correct or delete the row" for object_id, millis in OUT_OF_RANGE.items())
