"""The foreachBatch sink: purge each candidate of a micro-batch, on the executors.

A message candidate: its row goes by a conditional delete (the double-check),
then its ``payload_refs`` row; if no other message refers to the payload, the
payload is released (``sinks.control``) and its grace period starts. A payload
candidate, once its grace has passed, goes by the writer contract (README):
no reference left, ``live`` -> ``deleting`` on the ``last_ref_at`` seen, its
blob deleted from each data centre with the progress kept in the row's
``dcs``, and the row last. One store failing does not hold the others back;
the failed ones are retried after ``retry_interval``.

Dependents go before the record that leads to them, so a crash anywhere is
finished by the retry of the batch: a row found already gone still has its
reference, blobs and payload row seen to, all idempotently.

Each executor process keeps one Cassandra session, one S3 client per data
centre and one Kafka producer for its whole life. The sink returns one outcome
row per step (``OUTCOME_SCHEMA``), which ``PurgeSink.totals`` sums on the driver.

Example::

    query = candidates.writeStream.foreachBatch(PurgeSink(config)).start()
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Iterator

from pyspark.sql import DataFrame, Row
from pyspark.sql.types import LongType, StringType, StructField, StructType

from purger.config import PurgerConfig
from purger.connections import cassandra_session
from sinks.cassandra import ALREADY_GONE, LIVE, PURGED, SKIPPED, MessageDeleter, PayloadRows, epoch_ms, now_ms
from sinks.control import Reports
from sinks.objects import PayloadStores
from streams.processor import DEAD_LETTER, MESSAGE, PAYLOAD
from streams.rules import PAYLOAD as PAYLOAD_RULE
from streams.rules import Retention

log = logging.getLogger(__name__)

ERROR = "error"
DEAD_LETTERED = "dead_lettered"

OUTCOME_SCHEMA = StructType(
    [
        StructField("kind", StringType(), False),  # message | payload | dead_letter
        StructField("id", StringType(), False),
        StructField("rule", StringType()),
        StructField("dc", StringType()),  # the data centre, for a payload's blob
        StructField("status", StringType(), False),  # purged | already_gone | skipped | error | dead_lettered
        StructField("reason", StringType()),
        StructField("eligible_at_ms", LongType()),
        StructField("deleted_at_ms", LongType()),
        StructField("batch_id", LongType(), False),
    ]
)


@dataclass
class _Clients:
    messages: MessageDeleter
    payloads: PayloadRows
    stores: PayloadStores
    reports: Reports
    retention: Retention
    retry_ms: int


_executor_lock = threading.Lock()
_executor_clients: dict[str, _Clients] = {}


def _clients(config: PurgerConfig) -> _Clients:
    """This executor process's clients for a configuration, made once."""
    key = config.model_dump_json()
    with _executor_lock:
        if key not in _executor_clients:
            session = cassandra_session(config.cassandra)
            retention = Retention.from_config(config.retention)
            _executor_clients[key] = _Clients(
                MessageDeleter(session, config.cassandra, retention),
                PayloadRows(session, config.cassandra),
                PayloadStores(config.stores),
                Reports(config.kafka),
                retention,
                int(config.stream.retry_interval.total_seconds() * 1000),
            )
        return _executor_clients[key]


def _purge_message(c: Row, clients: _Clients, outcome) -> Iterator[tuple]:
    row = clients.messages.delete(c.id, c.rule, c.payload_id, c.inline)
    yield outcome(status=row.status, reason=row.reason, deleted_at_ms=now_ms() if row.status == PURGED else None)
    if row.status == SKIPPED:
        if row.recheck is not None:
            # The row will be eligible: look again then. Under the rule just checked, not sooner than
            # retry_interval (clocks may differ a little); under another rule, as soon as it is due.
            soonest = now_ms() + (clients.retry_ms if row.recheck.rule == c.rule else 0)
            clients.reports.recheck(MESSAGE, c.id, row.recheck.rule, max(row.recheck.eligible_at_ms, soonest))
        return
    if row.payload_id is None:
        return
    other = clients.messages.unreference(row.payload_id, c.id)
    if other is None and not row.inline:
        clients.reports.released(row.payload_id, c.id, c.eligible_at_ms, now_ms(), list(c.dcs or ()))


def _purge_payload(c: Row, clients: _Clients, outcome) -> Iterator[tuple]:
    grace_ms = clients.retention.payload_grace_ms
    referrer = clients.messages.referrer(c.id)
    if referrer is not None:
        yield outcome(status=SKIPPED, reason=f"referenced by message {referrer}")
        # Usually that message's own purge releases the payload again; the recheck covers a reference
        # that goes away otherwise (a writer that lost the race and removed its link).
        clients.reports.recheck(PAYLOAD, c.id, PAYLOAD_RULE, now_ms() + grace_ms)
        return
    row = clients.payloads.read(c.id)
    if row is None:
        # Gone with an earlier attempt: the blobs went before the row; deleting again is harmless.
        clients.stores.delete(c.id, list(c.dcs or ()))
        yield outcome(status=ALREADY_GONE)
        return
    if row["state"] == LIVE:
        last_ref_ms = epoch_ms(row["last_ref_at"])
        if last_ref_ms is not None and last_ref_ms > now_ms() - grace_ms:
            yield outcome(status=SKIPPED, reason="linked within payload_grace")
            clients.reports.recheck(PAYLOAD, c.id, PAYLOAD_RULE, last_ref_ms + grace_ms)
            return
        if not clients.payloads.start_deleting(c.id, row["last_ref_at"]):
            yield outcome(status=SKIPPED, reason="linked again while being purged")
            clients.reports.recheck(PAYLOAD, c.id, PAYLOAD_RULE, now_ms() + grace_ms)
            return
    failed = False
    for dc, error in clients.stores.delete(c.id, sorted(row["dcs"] or ())).items():
        if error is None:
            clients.payloads.deleted_from(c.id, dc)
            yield outcome(dc=dc, status=PURGED, deleted_at_ms=now_ms())
        else:
            failed = True
            yield outcome(dc=dc, status=ERROR, reason=error)
    if failed:
        clients.reports.recheck(PAYLOAD, c.id, PAYLOAD_RULE, now_ms() + clients.retry_ms)
    elif clients.payloads.delete(c.id):
        yield outcome(status=PURGED, deleted_at_ms=now_ms())


def purge_partition(candidates: Iterable[Row], config: PurgerConfig, batch_id: int) -> Iterator[tuple]:
    """Purge one partition's candidates and dead-letter its bad records; yield ``OUTCOME_SCHEMA`` tuples."""
    clients = _clients(config)
    for c in candidates:
        def outcome(status: str, dc: str | None = None, reason: str | None = None,
                    deleted_at_ms: int | None = None, c: Row = c) -> tuple:
            return (c.kind, c.id, c.rule, dc, status, reason, c.eligible_at_ms, deleted_at_ms, batch_id)

        if c.kind == DEAD_LETTER:
            clients.reports.dead_letter(c.key, c.value, c.reason, c.topic, c.partition, c.offset)
            yield outcome(DEAD_LETTERED, reason=c.reason)
            continue
        purge = _purge_message if c.kind == MESSAGE else _purge_payload
        try:
            yield from purge(c, clients, outcome)
        except Exception as error:  # Cassandra unavailable, timeouts: this candidate only, retried later
            log.warning("purge of %s %s failed, retrying in %d ms: %s", c.kind, c.id, clients.retry_ms, error)
            yield outcome(ERROR, reason=f"{type(error).__name__}: {error}")
            clients.reports.recheck(c.kind, c.id, c.rule, now_ms() + clients.retry_ms)
    # The batch commits only after every report is in Kafka.
    clients.reports.flush()


class PurgeSink:
    """The ``foreachBatch`` function. Keeps running totals of outcomes on the driver."""

    def __init__(self, config: PurgerConfig) -> None:
        self.config = config
        self.totals: Counter[tuple[str, str]] = Counter()

    def __call__(self, candidates: DataFrame, batch_id: int) -> None:
        config = self.config
        outcomes = candidates.rdd.mapPartitions(lambda rows: purge_partition(rows, config, batch_id))
        counts = (
            candidates.sparkSession.createDataFrame(outcomes, OUTCOME_SCHEMA)
            .groupBy("kind", "status")
            .count()
            .collect()
        )
        for r in counts:
            self.totals[(r["kind"], r["status"])] += r["count"]
