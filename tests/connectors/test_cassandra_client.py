"""The sessions' rows: the driver's own named tuples, each statement's row class made once."""

from __future__ import annotations

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
