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
centre and one Kafka producer for its whole life, and paces its deletions under
``stream.max_deletions_per_second`` (``sinks.throttle``). Under
``stream.dry_run`` it only decides, and records ``would_delete``.

Each step gives one outcome row (``OUTCOME_SCHEMA``). The driver keeps the
batch's outcomes on the executors (a local checkpoint, so the deletes are never
run twice to compute them again), appends them to the ledger exactly once per
batch (``sinks.ledger``), and sums them for the metrics (``purger.metrics``).
The daily report is refreshed beside the query, not in it (``streams.query``).

Example::

    query = candidates.writeStream.foreachBatch(PurgeSink(config)).start()
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from pyspark import TaskContext
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from core.config import PurgerConfig
from connectors import cassandra_session
from purger.metrics import PurgerMetrics
from sinks.cassandra import (
    ALREADY_GONE, LIVE, PURGED, SKIPPED, WOULD_DELETE, MessageDeleter, PayloadRows, epoch_ms, now_ms,
)
from sinks.control import Reports
from sinks.ledger import Ledger, lag_seconds
from sinks.objects import PayloadStores
from sinks.throttle import Pacer, bounded_map, per_task_rate
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
        # purged | would_delete | already_gone | skipped | error | dead_lettered
        StructField("status", StringType(), False),
        StructField("reason", StringType()),  # "<category>: <details>"
        StructField("eligible_at_ms", LongType()),
        StructField("decided_at_ms", LongType(), False),
        StructField("deleted_at_ms", LongType()),
        StructField("batch_id", LongType(), False),
        StructField("worker", StringType(), False),  # host:pid of the executor process that did it
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
    dry_run: bool


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
                config.stream.dry_run,
            )
        return _executor_clients[key]


Outcome = Callable[..., tuple]


EARLIER_ATTEMPT = "earlier attempt: found gone on a retry, so deleted by the attempt that failed"


def failpoint(name: str) -> None:
    """Fault injection for the kill tests (tests/test_faults.py): with ``PURGER_FAILPOINT=<name>`` the
    first process to reach ``name`` kills the purger's whole process group (kill -9), once per
    ``PURGER_FAILPOINT_MARKER`` file. Without the variable it does nothing."""
    if os.environ.get("PURGER_FAILPOINT") != name:
        return
    try:
        Path(os.environ["PURGER_FAILPOINT_MARKER"]).open("x").close()
    except FileExistsError:
        return
    # The session's group: the driver and its JVM (PySpark's worker daemon has a group of its own).
    os.killpg(os.getsid(0), signal.SIGKILL)


def _purge_message(c: Row, clients: _Clients, outcome: Outcome, retry: bool) -> Iterator[tuple]:
    if clients.dry_run:
        row = clients.messages.check(c.id, c.payload_id, c.inline)
        reason = row.reason
        if row.status == WOULD_DELETE and row.payload_id and not row.inline \
                and clients.messages.referrer(row.payload_id, other_than=c.id) is None:
            reason = f"{reason}; payload {row.payload_id} would be released"
        yield outcome(status=row.status, reason=reason)
        return
    row = clients.messages.delete(c.id, c.rule, c.payload_id, c.inline)
    if row.status == PURGED:
        failpoint("after_message_delete")
    if row.status == ALREADY_GONE and retry:
        # The failed attempt's outcomes never reached the ledger: its deletions are recorded now.
        yield outcome(status=PURGED, reason=EARLIER_ATTEMPT, deleted_at_ms=now_ms())
    else:
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
    clients.messages.unreference(row.payload_id, c.id)
    # An inline payload goes with its row; only a stored one is released, when no reference is left.
    if not row.inline and clients.messages.referrer(row.payload_id) is None:
        clients.reports.released(row.payload_id, c.id, c.eligible_at_ms, now_ms(), list(c.dcs or ()))


def _purge_payload(c: Row, clients: _Clients, outcome: Outcome, retry: bool) -> Iterator[tuple]:
    grace_ms = clients.retention.payload_grace_ms
    referrer = clients.messages.referrer(c.id)
    if referrer is not None:
        yield outcome(status=SKIPPED, reason=f"referenced: by message {referrer}")
        # Usually that message's own purge releases the payload again; the recheck covers a reference
        # that goes away otherwise (a writer that lost the race and removed its link).
        clients.reports.recheck(PAYLOAD, c.id, PAYLOAD_RULE, now_ms() + grace_ms)
        return
    row = clients.payloads.read(c.id)
    if row is None:
        if clients.dry_run:
            yield outcome(status=ALREADY_GONE)
        elif retry:
            # Gone with the attempt that failed: the blobs went before the row; deleting again is harmless.
            for dc, error in clients.stores.delete(c.id, sorted(c.dcs or ())).items():
                yield outcome(dc=dc, status=PURGED if error is None else ERROR, reason=error or EARLIER_ATTEMPT,
                              deleted_at_ms=now_ms() if error is None else None)
            yield outcome(status=PURGED, reason=EARLIER_ATTEMPT, deleted_at_ms=now_ms())
        else:
            clients.stores.delete(c.id, list(c.dcs or ()))
            yield outcome(status=ALREADY_GONE)
        return
    if row["state"] == LIVE:
        last_ref_ms = epoch_ms(row["last_ref_at"])
        if last_ref_ms is not None and last_ref_ms > now_ms() - grace_ms:
            yield outcome(status=SKIPPED, reason="recently linked: within payload_grace")
            clients.reports.recheck(PAYLOAD, c.id, PAYLOAD_RULE, last_ref_ms + grace_ms)
            return
        if clients.dry_run:
            yield from (outcome(dc=dc, status=WOULD_DELETE) for dc in sorted(row["dcs"] or ()))
            yield outcome(status=WOULD_DELETE)
            return
        if not clients.payloads.start_deleting(c.id, row["last_ref_at"]):
            yield outcome(status=SKIPPED, reason="relinked: while being purged")
            clients.reports.recheck(PAYLOAD, c.id, PAYLOAD_RULE, now_ms() + grace_ms)
            return
    elif clients.dry_run:
        yield outcome(status=SKIPPED, reason="being deleted: by a real run")
        return
    elif retry:
        # Data centres the attempt that failed had finished: their records went with it.
        for dc in sorted(set(c.dcs or ()) - set(row["dcs"] or ())):
            yield outcome(dc=dc, status=PURGED, reason=EARLIER_ATTEMPT, deleted_at_ms=now_ms())
    failed = False
    for dc in sorted(row["dcs"] or ()):
        # One data centre at a time, its progress in the row at once: a slow or failing store after it
        # does not hold back the record of what is done.
        error = clients.stores.delete(c.id, [dc])[dc]
        if error is None:
            clients.payloads.deleted_from(c.id, dc)
            failpoint("after_blob_delete")
            yield outcome(dc=dc, status=PURGED, deleted_at_ms=now_ms())
        else:
            failed = True
            yield outcome(dc=dc, status=ERROR, reason=error)
    if failed:
        clients.reports.recheck(PAYLOAD, c.id, PAYLOAD_RULE, now_ms() + clients.retry_ms)
    elif clients.payloads.delete(c.id):
        yield outcome(status=PURGED, deleted_at_ms=now_ms())


def purge_partition(candidates: Iterable[Row], config: PurgerConfig, batch_id: int,
                    deletions_per_second: float | None = None, batch_retried: bool = False) -> Iterator[tuple]:
    """Purge one partition's candidates and dead-letter its bad records; yield ``OUTCOME_SCHEMA`` tuples.

    Deletions are paced at ``deletions_per_second`` (this task's share of the cap; the whole cap if None).
    In a retried batch or task, an object found gone was deleted by the attempt that failed, whose
    outcomes were lost with it: it is recorded as purged then.
    """
    task = TaskContext.get()
    retry = batch_retried or (task is not None and task.attemptNumber() > 0)
    clients = _clients(config)
    pacer = Pacer(deletions_per_second or config.stream.max_deletions_per_second)
    worker = f"{socket.gethostname()}:{os.getpid()}"

    def purge_one(c: Row) -> list[tuple]:
        def outcome(status: str, dc: str | None = None, reason: str | None = None,
                    deleted_at_ms: int | None = None) -> tuple:
            return (c.kind, c.id, c.rule, dc, status, reason, c.eligible_at_ms, now_ms(), deleted_at_ms,
                    batch_id, worker)

        if c.kind == DEAD_LETTER:
            clients.reports.dead_letter(c.key, c.value, c.reason, c.topic, c.partition, c.offset)
            return [outcome(DEAD_LETTERED, reason=c.reason)]
        outcomes: list[tuple] = []
        purge = _purge_message if c.kind == MESSAGE else _purge_payload
        try:
            outcomes.extend(purge(c, clients, outcome, retry))
        except Exception as error:  # Cassandra unavailable, timeouts: this candidate only, retried later
            log.warning("purge of %s %s failed, retrying in %d ms: %s", c.kind, c.id, clients.retry_ms, error)
            outcomes.append(outcome(ERROR, reason=f"{type(error).__name__}: {error}"))
            clients.reports.recheck(c.kind, c.id, c.rule, now_ms() + clients.retry_ms)
        return outcomes

    def paced(c: Row) -> Row:
        if c.kind != DEAD_LETTER:
            pacer.wait()
        return c

    # Each candidate is a short chain of round trips (a lightweight transaction alone takes four):
    # ``delete_concurrency`` of them in flight per task keep Cassandra and the stores busy.
    with ThreadPoolExecutor(config.stream.delete_concurrency, thread_name_prefix="purge") as pool:
        for outcomes in bounded_map(pool, purge_one, map(paced, candidates), config.stream.delete_concurrency):
            yield from outcomes
    # The batch commits only after every report is in Kafka.
    clients.reports.flush()


def _first_attempt(spark: SparkSession, directory: str, batch_id: int, keep: int = 100) -> bool:
    """Mark batch ``batch_id`` as attempted (a file beside the checkpoint, on any Hadoop filesystem);
    False when an earlier attempt had marked it, i.e. this run of the batch is a retry."""
    hadoop = spark._jvm.org.apache.hadoop.fs  # type: ignore[union-attr]
    marker = hadoop.Path(f"{directory}/{batch_id}")
    fs = marker.getFileSystem(spark._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    if fs.exists(marker):
        return False
    fs.create(marker, False).close()
    fs.delete(hadoop.Path(f"{directory}/{batch_id - keep}"), False)
    return True


class SinkClosed(RuntimeError):
    """A batch reached the sink after the purger began to stop."""


class PurgeSink:
    """The ``foreachBatch`` function: purge on the executors, then the ledger and the metrics on the driver."""

    def __init__(self, config: PurgerConfig, metrics: PurgerMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or PurgerMetrics()
        self.query_id: str | None = None
        self._bound = threading.Event()
        self._ledger: Ledger | None = None  # made at the first batch, which brings the session
        self._gate = threading.Lock()  # held while a batch deletes and records
        self._closed = False

    def bind(self, query_id: str) -> None:
        """The query's id (kept in its checkpoint, so the same after a restart) names its ledger writes."""
        self.query_id = query_id
        self._bound.set()

    def close(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the batch under way to delete and record, then refuse the next
        ones. A query stopped between its deletions and its ledger write leaves them unrecorded until
        the batch runs again at the next start; a refused batch has deleted nothing."""
        finished = self._gate.acquire(timeout=timeout_s)
        self._closed = True
        if finished:
            self._gate.release()

    def __call__(self, candidates: DataFrame, batch_id: int) -> None:
        if not self._bound.wait(timeout=60):
            raise RuntimeError("PurgeSink.bind(query.id) was not called: the ledger cannot name its writes")
        with self._gate:
            if self._closed:
                raise SinkClosed(f"the purger is stopping: batch {batch_id} runs again from the checkpoint "
                                 "at the next start")
            self._purge(candidates, batch_id)

    def _purge(self, candidates: DataFrame, batch_id: int) -> None:
        spark = candidates.sparkSession
        config = self.config
        started = time.monotonic()
        rate = per_task_rate(config.stream.max_deletions_per_second, candidates.rdd.getNumPartitions(),
                             spark.sparkContext.defaultParallelism)
        retried = not _first_attempt(spark, f"{config.stream.checkpoint_location}/purger-attempts", batch_id)
        # Computed once and kept: computing the outcomes again would run the deletes again.
        outcomes = spark.createDataFrame(
            candidates.rdd.mapPartitions(lambda rows: purge_partition(rows, config, batch_id, rate, retried)),
            OUTCOME_SCHEMA,
        ).localCheckpoint(eager=True)
        counts = outcomes.groupBy("kind", "status").agg(
            F.count(F.lit(1)).alias("count"),
            F.collect_list(F.when(F.col("status") == PURGED, lag_seconds())).alias("lags"),
        ).collect()
        if counts:
            self._ledger = self._ledger or Ledger(spark, config.ledger)
            failpoint("before_ledger_write")
            self._ledger.append(outcomes, self.query_id, batch_id)
            failpoint("after_ledger_write")
            self.metrics.batch_done({(r["kind"], r["status"]): r["count"] for r in counts},
                                    [lag for r in counts for lag in r["lags"]], time.monotonic() - started)
        outcomes.unpersist()

    @property
    def totals(self) -> Counter[tuple[str, str]]:
        return self.metrics.totals
