"""When the clock ticks (``purger.streams.clock.caught_up``): once every source has read up to its latest
offsets, a backlog of the topics it is told to ignore (the reconcile topic's) aside. Plain Python: the query's
last progress as Spark writes it (its JSON)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from purger.streams.clock import caught_up

RECONCILE = frozenset({"purger.reconcile"})


def query(*sources: tuple[dict, dict | None]) -> SimpleNamespace:
    progress = {"sources": [{"endOffset": end, "latestOffset": latest} for end, latest in sources]}
    return SimpleNamespace(lastProgress=SimpleNamespace(json=json.dumps(progress)))


def test_every_source_read_to_its_latest_offsets_is_caught_up():
    assert caught_up(query(({"events": {"0": 5, "1": 7}}, {"events": {"0": 5, "1": 7}}),
                           ({"purger.control": {"0": 2}}, {"purger.control": {"0": 2}})))


def test_an_events_partition_behind_holds_the_clock_back_whatever_is_ignored():
    behind = query(({"events": {"0": 5, "1": 6}}, {"events": {"0": 5, "1": 7}}))
    assert not caught_up(behind) and not caught_up(behind, ignoring=RECONCILE)


def test_the_reconcile_topics_backlog_holds_it_back_only_when_not_ignored():
    # A source of its own, as new checkpoints read it, and within the events' source, as older ones do.
    apart = query(({"events": {"0": 5}}, {"events": {"0": 5}}),
                  ({"purger.reconcile": {"0": 100}}, {"purger.reconcile": {"0": 90_000}}))
    within = query(({"events": {"0": 5}, "purger.reconcile": {"0": 100}},
                    {"events": {"0": 5}, "purger.reconcile": {"0": 90_000}}))
    for backlog in (apart, within):
        assert not caught_up(backlog) and caught_up(backlog, ignoring=RECONCILE)


def test_no_progress_yet_or_no_latest_offsets_is_not_caught_up():
    assert not caught_up(SimpleNamespace(lastProgress=None))
    assert not caught_up(query())
    assert not caught_up(query(({"events": {"0": 5}}, None)))
