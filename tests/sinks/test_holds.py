"""The holds table on Cassandra (``purger.sinks.holds.CassandraHolds``): placing a hold where one stands, and where
another writer lifts it meanwhile."""

from __future__ import annotations

import uuid

from purger.holds import open_holds


def test_a_hold_placed_where_one_stands_returns_that_one_and_where_it_was_lifted_places_its_own(config):
    session, holds = open_holds(config)
    try:
        scope = f"mailbox:test-{uuid.uuid4().hex[:8]}"
        assert holds.place(scope, "case 1", "first") is None
        there = holds.place(scope, "case 2", "second")
        assert (there.scope, there.reason, there.placed_by) == (scope, "case 1", "first")
        assert holds.release(scope) == []
        assert holds.place(scope, "case 2", "second") is None
        assert holds.held([scope]).reason == "case 2"
        holds.release(scope)
    finally:
        session.cluster.shutdown()
