"""The candidates stream, top to bottom: Kafka sources -> parsed events -> stateful stage -> candidates.

One function builds it; the application (``purger.running``) and the benchmarks
(``bench/``) both call it and add their own sink.

Example::

    candidates = candidates_stream(spark, config)
    candidates.writeStream.foreachBatch(sink).start()
"""

from __future__ import annotations


from pyspark.accumulators import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from purger.core.settings import PurgerConfig
from purger.core.times import duration_ms
from purger.core.vocabulary import DEAD_LETTER, FORGOTTEN
from purger.streams.parse import parse_events
from purger.streams.processor import purge_candidates
from purger.streams.source import read_records


def candidates_stream(spark: SparkSession, config: PurgerConfig, starting_offsets: str | None = None,
                      starting_timestamp_ms: int | None = None, reconcile_apart: bool = True,
                      registered: Accumulator | None = None) -> DataFrame:
    """The purge candidates and dead letters of the configuration's enabled policies (``OUTPUT_SCHEMA``).

    Each batch's progress carries the purger's observed metrics (the Spark UI's streaming page and
    ``query.lastProgress["observedMetrics"]``): ``purger.input`` counts the events ignored as a disabled
    policy's, ``purger`` the candidates per kind, the dead letters, and per kind the objects forgotten without
    ever having been a candidate (``stream.forget_after``), whose rows go no further. ``registered``: an
    accumulator of the timers the stateful stage registers, for the clock (``streams.timers``).
    """
    policies = config.policy_set
    # 1. The events topics (and the policies' own), the reconcile topic and the control topic, as one stream.
    records = read_records(spark, config, starting_offsets, starting_timestamp_ms, reconcile_apart)
    # 2. Typed events of the enabled policies; a bad record carries its reason.
    events = parse_events(records, config.kafka.written_by_purger, policies).observe(
        "purger.input", F.count(F.when(F.col("ignored"), True)).alias("ignored"))
    # 3. Per object: state, one event-time timer, and a candidate when the watermark passes its due time.
    candidates = purge_candidates(events, policies, duration_ms(config.stream.watermark_delay),
                                  duration_ms(config.stream.forget_after), registered)
    forgotten = F.col("rule").eqNullSafe(FORGOTTEN)
    return candidates.observe(
        "purger",
        *(F.count(F.when((F.col("kind") == kind) & ~forgotten, True)).alias(name)
          for kind, name in [*((k.name, f"{k.name}_candidates") for k in policies.kinds),
                             (DEAD_LETTER, "dead_lettered")]),
        *(F.count(F.when((F.col("kind") == k.name) & forgotten, True)).alias(f"{k.name}_forgotten")
          for k in policies.kinds),
    ).where(~forgotten)
