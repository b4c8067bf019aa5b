"""``purger hold``, ``purger release`` and ``purger holds``: legal holds placed, released and listed
(docs/operations.md, "Legal holds"; the decision is ``purger.core.holds``, the table ``purger.sinks.holds``).

A hold is in force when ``hold`` returns: the purges read the holds before they claim or delete anything, so
only a decision that read them before the hold was written can still delete under it, and those are the
stream's batch in flight then, which ``hold`` waits for (its offsets are in the checkpoint before it starts,
its commit once it ended), then lists what it purged (the ledger's records of that batch). A release lifts the hold, then sends a recheck (``kafka.control_topic``) for each
candidate found held under it meanwhile, so what became due is purged with no event needed; one cut short is
finished by running it again.

Example::

    place_hold(spark, config, Scope.parse("message:m1"), "case 42", "jdoe", wait_s=600)
    # Placed(already=None, waited_for=4182, purged=[], exact=True)
    release_hold(config, Scope.parse("mailbox:alice"))   # 3: the candidates looked at again
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from purger.core.failpoints import failpoint
from purger.core.holds import Hold, Scope
from purger.core.times import from_epoch_ms, now_ms
from purger.core.vocabulary import PURGED
from purger.sinks.holds import CassandraHolds

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from purger.core.settings import PurgerConfig


class HoldRefused(Exception):
    """A hold command that cannot go on: one line that says why and what to do."""


def policies_naming(config: PurgerConfig, scope: Scope) -> list[str]:
    """The enabled policies whose objects a hold on ``scope`` can cover; none: the line that lists the scope
    kinds there are."""
    policies = [policy.name for policy in config.policy_set.policies if scope.kind in policy.hold_scopes()]
    if not policies:
        kinds = sorted({kind for policy in config.policy_set.policies for kind in policy.hold_scopes()})
        raise HoldRefused(f"scope {scope}: no enabled policy names a scope of kind {scope.kind!r}; "
                          f"the kinds are {', '.join(kinds)}")
    return policies


def open_holds(config: PurgerConfig) -> tuple[Any, CassandraHolds]:
    """A Cassandra session and the configured holds table, or the line that says to create it."""
    from cassandra import InvalidRequest

    from purger.connectors import cassandra_session

    session = cassandra_session(config.cassandra)
    try:
        return session, CassandraHolds.of(session, config.cassandra)
    except InvalidRequest:
        session.cluster.shutdown()
        cassandra = config.cassandra
        raise HoldRefused(f"table {cassandra.keyspace}.{cassandra.holds_table} (cassandra.holds_table) does not "
                          "exist: create it with `purger setup` and this configuration") from None


@dataclass(frozen=True)
class Placed:
    """What ``place_hold`` did: the hold already in force there (nothing placed), or the batch in flight it waited
    for and what that batch purged of the policies the scope covers: of the scope itself for an object's scope
    (``exact``), or all of them for a wider one (a mailbox: the ledger names messages, not their mailboxes)."""

    already: Hold | None = None
    waited_for: int | None = None
    purged: list[tuple[str, str, str | None]] = field(default_factory=list)  # kind, id, data centre
    exact: bool = True


def place_hold(spark: SparkSession, config: PurgerConfig, scope: Scope, reason: str, actor: str, wait_s: float,
               say: Callable[[str], None] = print) -> Placed:
    """Place a hold on ``scope`` and wait for the stream's batch in flight then (``wait_s`` at the most), then
    read what that batch purged from the ledger. A batch still running after ``wait_s`` is refused in one line:
    the hold stands, and is in force for every later batch."""
    policies = policies_naming(config, scope)
    session, holds = open_holds(config)
    try:
        there = holds.place(str(scope), reason, actor)
    finally:
        session.cluster.shutdown()
    if there is not None:
        return Placed(already=there)
    failpoint("after_hold_placed")
    location = config.stream.checkpoint_location
    flight = in_flight(spark, location)
    if flight is None:
        return Placed()
    query_id, batch, started_ms = flight
    say(f"waiting for batch {batch}, in flight when the hold was placed")
    deadline = time.monotonic() + wait_s
    while not ended(spark, location, batch):
        if time.monotonic() > deadline:
            raise HoldRefused(
                f"the hold on {scope} stands, but batch {batch} of {location} has not ended in {wait_s:.0f} s and "
                f"may still delete under it: what it deletes will be its `purged` records in the ledger (batch_id "
                f"{batch}); every later batch, and this one run again after a stop, sees the hold")
        time.sleep(0.5)
    exact = any(scope.kind in (kind.name for kind in policy.kinds) for policy in config.policy_set.policies)
    return Placed(waited_for=batch, purged=purged_by(spark, config, policies, query_id, batch, started_ms,
                                                    scope if exact else None), exact=exact)


def in_flight(spark: SparkSession, location: str) -> tuple[str, int, int] | None:
    """The checkpoint's batch started and not ended, if any (its offsets are written before it runs, its commit
    after): the query's id, the batch's and when it started (epoch milliseconds)."""
    from purger.streams.checkpoint import CheckpointFiles

    files = CheckpointFiles(spark, location)
    if not files.exists():
        return None
    offsets = files.log("offsets")
    started, committed = max(offsets, default=None), max(files.log("commits"), default=-1)
    if started is None or started <= committed:
        return None
    return files.query_id(), started, offsets[started].getModificationTime()


def ended(spark: SparkSession, location: str, batch: int) -> bool:
    from purger.streams.checkpoint import CheckpointFiles

    return max(CheckpointFiles(spark, location).log("commits"), default=-1) >= batch


def purged_by(spark: SparkSession, config: PurgerConfig, policies: list[str], query_id: str, batch: int,
              started_ms: int, scope: Scope | None) -> list[tuple[str, str, str | None]]:
    """The ledger's ``purged`` records of ``policies`` by a query's batch that started at ``started_ms``: of
    ``scope``'s object alone when given."""
    from pyspark.sql import functions as F

    from purger.sinks.ledger import Ledger

    started = from_epoch_ms(started_ms)
    ledger = Ledger(spark, config.ledger)
    records = ledger.records().where(
        (F.col("date") >= F.lit(started.date())) & (F.col("query_id") == query_id) & (F.col("batch_id") == batch)
        & (F.col("status") == PURGED) & F.col("policy").isin(policies))
    if scope is not None:  # its id as the ledger wrote it (a keyed hash in a pseudonymised ledger)
        records = records.where((F.col("kind") == scope.kind) & (F.col("id") == ledger.pseudonyms.id(scope.id)))
    return sorted(((row.kind, row.id, row.dc) for row in records.select("kind", "id", "dc").collect()),
                  key=lambda record: (record[0], record[1], record[2] or ""))


def release_hold(config: PurgerConfig, scope: Scope) -> int | None:
    """Release the hold on ``scope`` and send a recheck, now, for each candidate kept under it: how many; None
    when no hold stood there and none is left to recheck."""
    from purger.connectors import kafka_producer
    from purger.streams.control import ControlWriter

    session, holds = open_holds(config)
    try:
        kept = holds.release(str(scope))
        if kept is None:
            return None
        failpoint("after_hold_lifted")
        producer = kafka_producer(config.kafka, acks="all")
        control = ControlWriter(producer, config.kafka.control_topic, config.policy_set)
        at_ms = now_ms()
        for kind, object_id, rule in kept:
            control.recheck(kind, object_id, rule, at_ms)
        producer.flush(f"run `purger release {scope}` again: the hold is lifted, and what it kept is still listed")
        holds.forget(str(scope), kept)
        return len(kept)
    finally:
        session.cluster.shutdown()


def holds_in_force(config: PurgerConfig) -> list[tuple[Hold, int]]:
    """Every hold in force, with how many candidates each keeps now."""
    session, holds = open_holds(config)
    try:
        return holds.in_force()
    finally:
        session.cluster.shutdown()


def releases_cut_short(config: PurgerConfig) -> list[tuple[str, int]]:
    """The scopes of releases stopped before they sent their rechecks, with how many candidates each still keeps:
    ``purger release SCOPE`` again finishes each."""
    session, holds = open_holds(config)
    try:
        return holds.releases_cut_short()
    finally:
        session.cluster.shutdown()
