"""The mailbox platform's cases, shared by the sink, operations and fault tests."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterable, Sequence

from pyspark.sql import Row
from pyspark.sql import functions as F
from tenacity import Retrying, stop_after_delay, wait_fixed

from purger.connectors import CassandraTables
from purger.core.settings import PurgerConfig
from purger.core.policy import Attempt, Candidate, Control, Outcome, Resources, key_id
from purger.core.times import now_ms
from purger.core.vocabulary import ERROR, PURGED
from purger.policies.mailbox.deletes import MessagePurge
from purger.policies.mailbox.state import MESSAGE
from purger.sinks.failures import CassandraFailures
from purger.sinks.holds import CassandraHolds
from purger.sinks.journal import CassandraJournal
from purger.sinks.objects import ObjectStores
from simulation.mailbox import Platform
from simulation.policy_objects import PolicyObject, PolicyObjects, ledger_rows
from purger.sinks.ledger import Ledger
from purger.sinks.purge import OUTCOME_SCHEMA, purge_partition, to_ledger
from tests.support.configs import mailbox
from tests.support.waits import ago, wait_for


def new_id(prefix="sink"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def candidate(kind, object_id, rule, dcs=("dc1", "dc2"), payload_id=None):
    """A candidate row as the stateful stage emits it (``streams.processor.OUTPUT_SCHEMA``)."""
    hint = {"payload_id": payload_id, "inline": False, "dcs": list(dcs)}
    return Row(kind=kind, id=object_id, rule=rule, eligible_at_ms=int(time.time() * 1000), hint=json.dumps(hint),
               reason=None, key=None, value=None, topic=None, partition=None, offset=None)


class RecordingControl(Control):
    """The control a purge reports to, recorded: rechecks and control events (a payload released)."""

    def __init__(self) -> None:
        self.rechecks: list[tuple[str, str, str, int]] = []
        self.reports: list[tuple[str, str, int, dict[str, Any]]] = []

    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        self.rechecks.append((kind, object_id, rule, at_ms))

    def report(self, event_type: str, object_id: str, event_time_ms: int, **fields: Any) -> None:
        self.reports.append((event_type, object_id, event_time_ms, fields))


def message_purge(session: Any, config: PurgerConfig, dry_run: bool = False) -> tuple[MessagePurge, RecordingControl]:
    """The mailbox policy's message purge on ``session``, as an executor builds it, and its recorded control."""
    control = RecordingControl()
    keyspace = config.cassandra.keyspace
    resources = Resources(partial(CassandraTables, session, keyspace), ObjectStores(config.stores), control,
                          CassandraJournal(session, keyspace, config.cassandra.journal_table),
                          CassandraHolds.of(session, config.cassandra), CassandraFailures.of(session, config),
                          retry_ms=2_000, dry_run=dry_run)
    return config.policy_set.policy_of(MESSAGE).purges(resources)[MESSAGE], control


def purge_message(purge: MessagePurge, message_id: str, rule: str, payload_id: str | None = None,
                  batch: str = "q/1") -> Outcome:
    """The message's own outcome of one purge (``payload_id``: the stream's hint; None, as after a replay
    from a timestamp, makes the purge ask the row)."""
    return own(purge_message_all(purge, message_id, rule, payload_id, batch))


def purge_message_all(purge: MessagePurge, message_id: str, rule: str, payload_id: str | None = None,
                      batch: str = "q/1") -> list[Outcome]:
    """Every outcome of one purge: the message's and those of what went with it (its ``payload_refs`` row)."""
    hint = {"payload_id": payload_id, "inline": False, "dcs": ["dc1", "dc2"]} if payload_id else {}
    return list(purge.purge(Candidate(MESSAGE, message_id, rule, now_ms(), hint), Attempt(batch=batch)))


def own(outcomes: Iterable[Outcome]) -> Outcome:
    """The candidate's own outcome among a purge's (a dependent's or follower's names its kind)."""
    [outcome] = [o for o in outcomes if o.kind is None]
    return outcome


def purge(config, *candidates):
    """The candidates purged by the sink's own code, as one batch of a query of its own (so never a retry): the
    ledger's rows."""
    return [dict(zip(OUTCOME_SCHEMA.names, o))
            for o in to_ledger(purge_partition(list(candidates), config, batch_id=0, query_id=new_id("query")))]


def unreferenced_payload(platform, config, dcs=("dc1", "dc2")):
    """A payload whose only message is gone, linked long before the grace period."""
    m, p = new_id("msg"), new_id("pay")
    platform.enqueue(m, p, dcs=dcs, at=ago(mailbox(config).payload_grace))
    platform.session.execute(f"DELETE FROM {mailbox(config).payload_refs_table} WHERE payload_id = %s", (p,))
    return p


def deletable(platform: Platform, config: PurgerConfig, n: int, tag: str,
              sent: dict[str, bool] | None = None) -> list[str]:
    """``n`` messages deleted by the platform long enough ago, each with a payload in both data centres;
    noted in ``sent`` (message id -> row expected to stay) when given."""
    ids = [f"{tag}-{uuid.uuid4().hex[:6]}-{i}" for i in range(n)]
    for m in ids:
        platform.enqueue(m, f"p-{m}")
        platform.delete(m, at=ago(mailbox(config).deleted_ttl))
        if sent is not None:
            sent[m] = False
    platform.flush()
    return ids


def write_work(platform: Platform, prefix: str, n: int, config, eligible: list[str], live: list[str]) -> None:
    """``n`` deleted messages, eligible at once, and one live message; their ids added to the lists."""
    for _ in range(n):
        m = f"{prefix}-{uuid.uuid4().hex[:8]}"
        platform.enqueue(m, f"p-{m}", at=ago(mailbox(config).deleted_ttl))
        platform.delete(m, at=ago(mailbox(config).deleted_ttl))
        eligible.append(m)
    m = f"{prefix}-live-{uuid.uuid4().hex[:8]}"
    platform.enqueue(m, f"p-{m}", extract_count=1)
    live.append(m)
    platform.flush()


def end_state(spark, platform: Platform, config, eligible: list[str], live: list[str],
              objects: PolicyObjects | None = None, written: Sequence[PolicyObject] = ()) -> tuple[list, set, set, set]:
    """What a run left: the live messages deleted (row, payload row or a blob) and the kept objects of the
    other policies not intact, and the ledger's `purged` records against one per eligible message, its
    reference, payload row and blob, and per row of the other policies' eligible objects (``written``, through ``objects``):
    (wrongly_deleted, missing, doubled, unexpected)."""
    wrongly_deleted = [m for m in live if platform.row(m) is None or not platform.payload_intact(f"p-{m}")]
    wrongly_deleted += [o.id for o in written if not o.eligible and not objects.intact(o)]
    records = Counter((r["kind"], r["id"], r["dc"]) for r in Ledger(spark, config.ledger).records()
                      .where(F.col("status") == "purged").collect())
    expected = {("message", m, None) for m in eligible}
    expected |= {("payload_refs", key_id([f"p-{m}", m]), None) for m in eligible}
    expected |= {("payload", f"p-{m}", dc) for m in eligible for dc in (None, "dc1", "dc2")}
    expected |= {(kind, row_id, None) for o in written if o.eligible for _, kind, row_id in ledger_rows(o)}
    return (wrongly_deleted, expected - set(records), {k for k, n in records.items() if n > 1},
            set(records) - expected)


@dataclass
class OutageRun:
    """What a purger running through outages left: its restarts, errors, and the end state (``end_state``)."""

    restarts: int
    errors: int
    error_records: int
    wrongly_deleted: list[str]
    missing: list
    doubled: list
    unexpected: list


def purge_through_outages(spark, config: PurgerConfig, tag: str,
                          outages: Callable[[Callable[[], None]], None]) -> OutageRun:
    """A purger purges the platform's messages while ``outages(more_work)`` takes servers away and brings them
    back, writing more work when it likes; a query that fails is restarted from its checkpoint, as a supervisor
    would. Ends once every eligible message is gone."""
    from purger.running import start_purger

    platform = Platform(config)
    eligible: list[str] = []
    live: list[str] = []

    def more_work(n: int = 4) -> None:
        # The platform's session reconnects after an outage, and at SERIAL its conditional writes wait for
        # every data centre: until then it cannot write.
        Retrying(stop=stop_after_delay(120), wait=wait_fixed(2), reraise=True)(
            write_work, platform, tag, n, config, eligible, live)

    running = start_purger(spark, config)
    restarts = 0

    def supervised(condition: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            nonlocal running, restarts
            if not running.query.isActive:
                running.stop()
                running, restarts = start_purger(spark, config), restarts + 1
            return condition()
        return check

    try:
        more_work()
        wait_for(supervised(lambda: running.sink.totals[("message", PURGED)] >= 1), timeout_s=120,
                 what="the first deletions")
        more_work(8)
        outages(more_work)
        more_work()
        wait_for(supervised(lambda: all(platform.row(m) is None and platform.payload_gone(f"p-{m}")
                                        for m in eligible)),
                 timeout_s=420, what="every eligible message after the outages")
        time.sleep(5)  # the last batch's ledger write
    finally:
        running.stop()
    try:
        errors = running.sink.totals[("message", ERROR)] + running.sink.totals[("payload", ERROR)]
        wrongly_deleted, missing, doubled, unexpected = end_state(spark, platform, config, eligible, live)
        error_records = Ledger(spark, config.ledger).records().where(F.col("status") == ERROR).count()
    finally:
        platform.close()
    return OutageRun(restarts, errors, error_records, wrongly_deleted, missing, doubled, unexpected)
