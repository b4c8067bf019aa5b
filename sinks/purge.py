"""The foreachBatch sink: purge each candidate of a micro-batch, on the executors.

For every candidate the row goes first, by a conditional delete that is the
double-check; then, if the row was purged (now or by an earlier attempt of the
same batch), the payload's blobs go from every data centre. A crash between
the two is finished by the retry: the row is then already gone and the blobs
are deleted again, idempotently.

Each executor process keeps one Cassandra session and one S3 client per data
centre for its whole life. The sink returns one outcome row per deletion
attempt (``OUTCOME_SCHEMA``), which ``PurgeSink.totals`` sums on the driver.

Example::

    query = candidates.writeStream.foreachBatch(PurgeSink(config)).start()
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Iterable, Iterator

from pyspark.sql import DataFrame, Row
from pyspark.sql.types import LongType, StringType, StructField, StructType

from purger.config import PurgerConfig
from purger.connections import cassandra_session
from sinks.cassandra import ALREADY_GONE, PURGED, MessageDeleter
from sinks.objects import PayloadStores

OUTCOME_SCHEMA = StructType(
    [
        StructField("kind", StringType(), False),  # message | payload
        StructField("id", StringType(), False),
        StructField("rule", StringType(), False),
        StructField("dc", StringType()),  # the data centre, for payload blobs
        StructField("status", StringType(), False),  # purged | already_gone | skipped | error
        StructField("reason", StringType()),
        StructField("eligible_at_ms", LongType(), False),
        StructField("deleted_at_ms", LongType()),
        StructField("batch_id", LongType(), False),
    ]
)

_executor_lock = threading.Lock()
_executor_clients: dict[str, tuple[MessageDeleter, PayloadStores]] = {}


def _clients(config: PurgerConfig) -> tuple[MessageDeleter, PayloadStores]:
    """This executor process's session and stores for a configuration, made once."""
    key = config.model_dump_json()
    with _executor_lock:
        if key not in _executor_clients:
            session = cassandra_session(config.cassandra)
            _executor_clients[key] = (
                MessageDeleter(session, config.cassandra, config.retention),
                PayloadStores(config.stores),
            )
        return _executor_clients[key]


def purge_partition(candidates: Iterable[Row], config: PurgerConfig, batch_id: int) -> Iterator[tuple]:
    """Purge one partition's candidates; yield ``OUTCOME_SCHEMA`` tuples."""
    deleter, stores = _clients(config)
    for c in candidates:
        row = deleter.delete(c.message_id, c.rule)
        now_ms = int(time.time() * 1000)
        deleted_at = now_ms if row.status == PURGED else None
        yield ("message", c.message_id, c.rule, None, row.status, row.reason, c.eligible_at_ms, deleted_at, batch_id)
        if row.status not in (PURGED, ALREADY_GONE) or c.inline or not c.payload_id:
            continue
        for dc, error in stores.delete(c.payload_id, list(c.dcs or ())).items():
            yield (
                "payload", c.payload_id, c.rule, dc, "error" if error else PURGED, error,
                c.eligible_at_ms, None if error else int(time.time() * 1000), batch_id,
            )


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
