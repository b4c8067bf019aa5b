"""``core.sizing``: what a volume needs (SPEC 10.6), as docs/sizing.md's formulas give it; and the docs' worked
examples are what it prints."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from purger.core.sizing import (
    CATCH_UP_H, DECISIONS_PER_CORE_S, EVENTS_HEADROOM, EVENTS_PER_CORE_S, PARTITION_STATE_BYTES, Volume, parse_rate,
    size,
)
from purger.output import sizing_lines
from tests.support import ROOT


def test_ten_million_a_day_is_docs_sizing_worked_example():
    sizing = size(Volume(10e6))
    assert (round(sizing.events_per_s), round(sizing.decisions_per_s), round(sizing.paxos_rounds_per_s)) == (255, 197,
                                                                                                         278)
    assert round(sizing.state_rows / 1e6) == 104 and round(sizing.state_bytes / 1e9, 1) == 7.9
    assert sizing.shuffle_partitions == 16 and sizing.max_deletions_per_second == 600 and sizing.cores == 6


@pytest.mark.parametrize("rate", ["100M", "1B"])
def test_docs_sizing_shows_what_setup_prints_at_each_worked_volume(rate):
    """docs/sizing.md's blocks at 100 million and 1 billion messages a day are `purger setup --rate`'s lines."""
    printed = sizing_lines(size(Volume(parse_rate(rate))))
    assert "\n".join(printed).strip() in (ROOT / "docs" / "sizing.md").read_text()


volumes = st.builds(Volume, messages_per_day=st.floats(1e3, 1e10), events_per_message=st.floats(1, 10),
                    payloads_per_message=st.floats(0, 5), retention_days=st.floats(0.1, 400))


@given(volumes)
def test_the_settings_cover_the_volume(volume):
    sizing = size(volume)
    # The cap decides the steady rate and a day's backlog within CATCH_UP_H; the cores keep up with it and with
    # bursts of events; no state partition holds more than the largest restarted here.
    assert sizing.max_deletions_per_second >= sizing.decisions_per_s * (1 + 24 / CATCH_UP_H) - 1e-6
    assert sizing.cores * DECISIONS_PER_CORE_S >= sizing.max_deletions_per_second
    assert sizing.cores * EVENTS_PER_CORE_S >= sizing.events_per_s * EVENTS_HEADROOM
    assert sizing.shuffle_partitions >= sizing.cores
    assert sizing.shuffle_partitions * PARTITION_STATE_BYTES >= sizing.state_bytes
    assert sizing.reconcile_topic_partitions == sizing.shuffle_partitions and sizing.control_topic_partitions >= 1
    assert 16 <= sizing.delete_concurrency <= 256
    assert all(value > 0 for value in sizing.settings().values())


@given(volumes, st.floats(1.01, 100))
def test_more_messages_never_need_less(volume, factor):
    smaller, larger = size(volume), size(Volume(volume.messages_per_day * factor, volume.events_per_message,
                                                volume.payloads_per_message, volume.retention_days))
    for name in ("cores", "shuffle_partitions", "max_deletions_per_second", "max_offsets_per_trigger",
                 "reconcile_max_offsets_per_trigger", "control_topic_partitions"):
        assert getattr(larger, name) >= getattr(smaller, name), name


@pytest.mark.parametrize("text, messages", [("100000000", 1e8), ("100M", 1e8), ("1B", 1e9), ("1g", 1e9),
                                            ("250k", 2.5e5), ("1.5M/day", 1.5e6), (" 2 m / d ", 2e6)])
def test_a_rate_is_read_as_written(text, messages):
    assert parse_rate(text) == messages


@pytest.mark.parametrize("text", ["", "0", "-5M", "ten", "5T", "1e9", "100M/hour"])
def test_a_rate_that_is_not_one_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="is not a rate of messages a day"):
        parse_rate(text)


def test_setup_with_a_rate_that_is_not_one_exits_2_in_one_line():
    from typer.testing import CliRunner

    from purger.cli import app

    result = CliRunner().invoke(app, ["setup", "--rate", "lots"])
    assert result.exit_code == 2
    assert result.output.strip() == "--rate: 'lots' is not a rate of messages a day: write e.g. 100M or 1B (a day)"
