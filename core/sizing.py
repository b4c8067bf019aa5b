"""What a deployment needs for the volume it expects (SPEC 10.6): cores, state partitions, the purger's own
topics' partitions, offsets per batch, deletions in flight and the deletion cap, from a platform's new
messages a day, by docs/sizing.md's formulas and the per-core rates measured here (BENCHMARKS.md).

Volume is configuration: ``purger setup --rate`` prints these settings and creates the purger's own topics
with these partitions; nothing in the code changes with the rate.

Example::

    sizing = size(Volume(messages_per_day=100_000_000))
    sizing.cores                    # executor cores for steady state, a day's backlog in 12 h and the reconcile
    sizing.settings()["stream.shuffle_partitions"]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

DAY_S = 86_400

# Per core, extrapolated from 2 cores (docs/sizing.md, "Per-core figures"): the stateful stage at 17 million state
# rows scaled to the Intel Xeon; the delete path (bench.deletes); a reconcile's scan (bench.reconcile --scan-only).
EVENTS_PER_CORE_S = 1_040
DECISIONS_PER_CORE_S = 216
RECONCILE_ROWS_PER_CORE_S = 31_675
# State on disk per state row at 17.3 million rows, and state rows per message at 70% stored payloads
# (bench.state_scale): a message's row and its payload's, and what the stateful stage keeps beside them.
STATE_ROW_BYTES = 76
STATE_ROWS_PER_OBJECT = 1.73 / 1.7
# The largest state partition restarted here (660 MB in 56 s): more state per partition, a longer restart.
PARTITION_STATE_BYTES = 660_000_000
# Bursts over the day's mean, for the stateful stage (docs/sizing.md, formula 1).
EVENTS_HEADROOM = 3
# A day's backlog (an outage of a day) decided within this many hours: the deletion cap is the steady rate
# plus the backlog over this time (formula 7).
CATCH_UP_H = 12
# Paxos rounds per decision: a message's 1, a stored payload's 2 (bench.requests).
MESSAGE_ROUNDS, PAYLOAD_ROUNDS = 1, 2
# The slowest common decision (a payload purged in two data centres, 12.5 ms one at a time; bench.requests):
# the deletions in flight the cap needs are the cap times it.
DECISION_S = 0.0125
# A batch of the events backlog takes about this long at the cores' rate.
BATCH_S = 10
# During a bootstrap, new objects purged within this lag (docs/sizing.md, "Purging while catching up"): a batch
# of the feed's fixed part, its records per due row and the share of fed rows due.
BOOTSTRAP_LAG_S, FEED_BATCH_FIXED_S, RECORDS_PER_DUE_ROW, DUE_SHARE = 60, 4, 3, 0.5
# Records a second one partition of the purger's control topic is given (clock ticks, rechecks, released
# payloads): assumed, far under what one Kafka partition takes, so that its readers' tasks stay short.
CONTROL_RECORDS_PER_PARTITION_S = 5_000


@dataclass(frozen=True)
class Volume:
    """What a platform expects: new messages a day, events per message, stored payloads per message (each an
    object of its own), and how many days an object stays in the state before its purge (its retention)."""

    messages_per_day: float
    events_per_message: float = 2.2
    payloads_per_message: float = 0.7
    retention_days: float = 6
    reconcile_rows_per_s: float = 20_000  # reconcile.max_rows_per_second

    def __post_init__(self) -> None:
        for name in ("messages_per_day", "events_per_message", "retention_days", "reconcile_rows_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be above 0, not {getattr(self, name)}")
        if self.payloads_per_message < 0:
            raise ValueError(f"payloads_per_message must be 0 or more, not {self.payloads_per_message}")


@dataclass(frozen=True)
class Sizing:
    volume: Volume
    events_per_s: float
    decisions_per_s: float  # at steady state: every object purged once
    paxos_rounds_per_s: float  # at steady state
    state_rows: float
    state_bytes: float
    max_deletions_per_second: int  # the cap: steady state plus a day's backlog in CATCH_UP_H
    paxos_rounds_at_cap_per_s: float
    cores: int
    shuffle_partitions: int
    delete_concurrency: int
    max_offsets_per_trigger: int
    reconcile_max_offsets_per_trigger: int
    reconcile_topic_partitions: int
    control_topic_partitions: int

    def settings(self) -> dict[str, int]:
        """The configuration keys this volume sets, by their names in the file."""
        return {
            "stream.shuffle_partitions": self.shuffle_partitions,
            "stream.max_deletions_per_second": self.max_deletions_per_second,
            "stream.delete_concurrency": self.delete_concurrency,
            "kafka.max_offsets_per_trigger": self.max_offsets_per_trigger,
            "kafka.reconcile_max_offsets_per_trigger": self.reconcile_max_offsets_per_trigger,
        }


def size(volume: Volume) -> Sizing:
    """docs/sizing.md's formulas for ``volume``, rounded up where a setting must be whole."""
    objects_per_message = 1 + volume.payloads_per_message
    events_per_s = volume.messages_per_day * volume.events_per_message / DAY_S
    decisions_per_s = volume.messages_per_day * objects_per_message / DAY_S
    rounds_per_decision = (MESSAGE_ROUNDS + PAYLOAD_ROUNDS * volume.payloads_per_message) / objects_per_message
    state_rows = volume.messages_per_day * volume.retention_days * objects_per_message * STATE_ROWS_PER_OBJECT
    backlog = volume.messages_per_day * objects_per_message
    cap = _round_up(decisions_per_s + backlog / (CATCH_UP_H * 3600), 100)
    cores = _round_up(events_per_s * EVENTS_HEADROOM / EVENTS_PER_CORE_S + cap / DECISIONS_PER_CORE_S
                      + volume.reconcile_rows_per_s / RECONCILE_ROWS_PER_CORE_S, 2)
    partitions = _round_up(max(cores, state_rows * STATE_ROW_BYTES / PARTITION_STATE_BYTES), 8)
    feed = (BOOTSTRAP_LAG_S / 3 - FEED_BATCH_FIXED_S) * cap * RECORDS_PER_DUE_ROW / DUE_SHARE
    return Sizing(
        volume=volume,
        events_per_s=events_per_s,
        decisions_per_s=decisions_per_s,
        paxos_rounds_per_s=decisions_per_s * rounds_per_decision,
        state_rows=state_rows,
        state_bytes=state_rows * STATE_ROW_BYTES,
        max_deletions_per_second=cap,
        paxos_rounds_at_cap_per_s=cap * rounds_per_decision,
        cores=cores,
        shuffle_partitions=partitions,
        # Per task: the cap's deletions in flight spread over the partitions, never under the default 16.
        delete_concurrency=min(256, max(16, math.ceil(cap * DECISION_S / partitions))),
        max_offsets_per_trigger=_round_up(cores * EVENTS_PER_CORE_S * BATCH_S, 1_000),
        reconcile_max_offsets_per_trigger=_round_up(feed, 1_000),
        # The feed keyed by object id, read by as many tasks as the state has partitions.
        reconcile_topic_partitions=partitions,
        control_topic_partitions=max(1, math.ceil(decisions_per_s / CONTROL_RECORDS_PER_PARTITION_S)),
    )


def _round_up(value: float, step: int) -> int:
    return max(step, math.ceil(value / step) * step)


_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}


def parse_rate(text: str) -> float:
    """Messages a day as written on a command line: ``100000000``, ``100M``, ``1B`` (or ``1G``), ``250k``,
    ``1.5M``; an optional ``/day``."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMbBgG]?)\s*(?:/\s*d(?:ay)?)?\s*", text)
    if not found or float(found.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a rate of messages a day: write e.g. 100M or 1B (a day)")
    return float(found.group(1)) * _SUFFIXES[found.group(2).lower()]
