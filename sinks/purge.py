"""The purge of one partition of a micro-batch's candidates, on an executor.

Each candidate goes to its kind's purge (``purger.core.purge_protocol.ObjectPurge``), which
double-checks it against its row and deletes it, dependents first; each bad
record goes to the dead-letter topic. Deletions are paced under
``stream.max_deletions_per_second`` (``sinks.throttle``), with
``stream.delete_concurrency`` candidates in flight. A candidate whose purge
raises (Cassandra unavailable, a timeout) is recorded as an ``error`` and
rechecked after ``stream.retry_interval``. Every decision is one outcome row
(``OUTCOME_SCHEMA``), for the ledger.

Example::

    outcomes = list(to_ledger(purge_partition(rows, config, batch_id=7)))
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

from pyspark.sql import Row
from pyspark.sql.types import LongType, StringType, StructField, StructType

from purger.core.settings import PurgerConfig
from purger.core.handles import Retry
from purger.core.purge_protocol import Attempt, Candidate, Outcome
from purger.core.times import duration_ms, now_ms
from purger.core.vocabulary import DEAD_LETTER, DEAD_LETTERED, ENGINE, ERROR
from purger.sinks.clients import executor_clients
from purger.sinks.throttle import Pacer, bounded_map

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

OUTCOME_SCHEMA = StructType(
    [
        StructField("policy", StringType(), False),
        StructField("kind", StringType(), False),  # the object's kind, or dead_letter
        StructField("id", StringType(), False),
        StructField("rule", StringType()),
        StructField("dc", StringType()),  # the data centre, for a blob
        # purged | would_delete | already_gone | skipped | error | dead_lettered
        StructField("status", StringType(), False),
        StructField("reason", StringType()),  # "<category>: <details>"
        StructField("eligible_at_ms", LongType()),
        StructField("decided_at_ms", LongType(), False),
        StructField("deleted_at_ms", LongType()),
        StructField("batch_id", LongType(), False),
        StructField("worker", StringType(), False),  # host:pid of the executor process that did it
        # A deletion recorded from the purger's intent: the batch that meant it
        # (``core.purge_protocol.Outcome.intent``).
        StructField("intent", StringType()),
    ]
)


# After a tuple's ledger columns: whether it goes to the ledger (``Outcome.recorded``); counted either way.
RECORDED = len(OUTCOME_SCHEMA.fields)


def to_ledger(outcomes: Iterable[tuple]) -> Iterator[tuple]:
    """The ledger's rows of ``purge_partition``'s outcomes: those it records, without the flag."""
    return (outcome[:RECORDED] for outcome in outcomes if outcome[RECORDED])


def purge_partition(candidates: Iterable[Row], config: PurgerConfig, batch_id: int,
                    deletions_per_second: float | None = None, query_id: str = "") -> Iterator[tuple]:
    """Purge one partition's candidates and dead-letter its bad records; yield ``OUTCOME_SCHEMA`` tuples, each
    followed by whether the ledger records it (``RECORDED``, ``to_ledger``).

    Deletions are paced at ``deletions_per_second`` (this task's share of the cap; the whole cap if None).
    A second run of the partition (a retried batch, task or stage) may find its records in the ledger already:
    the ledger keeps one of each (``sinks.ledger``).
    """
    rows = iter(candidates)
    first = next(rows, None)
    if first is None:  # nothing to purge: no clients, no mark
        return
    clients = executor_clients(config)
    attempt = Attempt(batch=f"{query_id}/{batch_id}")
    policies = config.policy_set
    worker = worker_name()

    def purge_one(row: Row) -> list[tuple]:
        def record(o: Outcome, policy: str = ENGINE) -> tuple:
            return (*outcome_row(policy, o.kind or row.kind, o.id or row.id, row.rule, o.dc, o, row.eligible_at_ms,
                                 batch_id, worker), o.recorded)

        if row.kind == DEAD_LETTER:
            clients.dead_letters.send(row.key, row.value, row.reason, row.topic, row.partition, row.offset)
            return [record(Outcome(DEAD_LETTERED, row.reason))]
        policy = policies.policy_of(row.kind).name
        candidate = Candidate(row.kind, row.id, row.rule, row.eligible_at_ms, json.loads(row.hint or "{}"))
        outcomes: list[tuple] = []
        try:
            outcomes.extend(record(o, policy) for o in clients.purges[row.kind].purge(candidate, attempt))
        except Exception as error:  # Cassandra unavailable, timeouts: this candidate only, retried later
            said = f"{type(error).__name__}: {error}"
            try:
                retry = clients.failures.failed(row.kind, row.id, said)
            except Exception:  # Cassandra is what failed: the first backoff, recorded
                retry = Retry(now_ms() + duration_ms(config.stream.retry_interval), True, 1)
            log.warning("purge of %s %s failed (%d in a row), retrying in %d ms: %s", row.kind, row.id,
                        retry.failures, retry.at_ms - now_ms(), error)
            outcomes.append(record(Outcome(ERROR, said, recorded=retry.record), policy))
            clients.control.recheck(row.kind, row.id, row.rule, retry.at_ms)
        return outcomes

    for outcomes in decided(itertools.chain([first], rows), purge_one, config, "purge",
                            deletions_per_second or config.stream.max_deletions_per_second,
                            paced=lambda row: row.kind != DEAD_LETTER):
        yield from outcomes
    # The batch commits only after every report is in Kafka and the blobs left in case are sent.
    clients.flush()


def decided(rows: Iterable[T], decide: Callable[[T], R], config: PurgerConfig, name: str, rate: float,
            paced: Callable[[T], bool] = lambda _: True) -> Iterator[R]:
    """The executor's decision loop, a batch's candidates' or a sweep's orphans': ``decide`` over ``rows`` in
    order, ``stream.delete_concurrency`` in flight on threads named ``name``, each row that ``paced`` says
    deletes paced at ``rate`` a second (this task's share of the cap)."""
    pacer = Pacer(rate)

    def in_turn(row: T) -> T:
        if paced(row):
            pacer.wait()
        return row

    # Each decision is a short chain of round trips (a lightweight transaction alone takes four):
    # ``delete_concurrency`` of them in flight per task keep Cassandra and the stores busy.
    concurrency = config.stream.delete_concurrency
    with ThreadPoolExecutor(concurrency, thread_name_prefix=name) as pool:
        yield from bounded_map(pool, decide, map(in_turn, rows), concurrency)


def outcome_row(policy: str, kind: str, object_id: str, rule: str | None, dc: str | None, outcome: Outcome,
                eligible_at_ms: int | None, batch_id: int, worker: str) -> tuple:
    """A decision's ``OUTCOME_SCHEMA`` tuple, decided now by ``worker`` (``worker_name``)."""
    return (policy, kind, object_id, rule, dc, outcome.status, outcome.reason, eligible_at_ms, now_ms(),
            outcome.deleted_at_ms, batch_id, worker, outcome.intent)


def worker_name() -> str:
    """The process that decides, as the ledger's ``worker`` names it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"
