"""Events per second through the stateful stage and through a replay, beside their ceilings.

    python -m bench.stateful --messages 100000

Over one topic holding the default workload's events (without rows or blobs: the
stateful stage never reads them), in this order:

1. a plain kafka-python read of the topic (the ceiling of any Kafka reader here);
2. a native Spark aggregation over the same routed rows, with the same source,
   parsing and state store: a count and the latest event time per object (the
   ceiling of the stateful stage);
3. the stateful stage (parsing, routing, ``transformWithState``) into Spark's
   noop sink, with a clock tick every second so timers fire as the backlog is
   read, as they would live: once with the state in Spark's unsaferow encoding,
   once in Avro (the purger's);
4. the whole purger replaying the topic from the earliest offset: the rate at
   which it reads up to the end, then the time until every candidate was
   decided (double-checked against Cassandra, and found gone), and per kind
   the decisions per second from its first to its last (from the ledger: the
   messages' batch, then their payloads', which their release leads to).

Each Spark run starts from a fresh checkpoint, reads ``max_offsets_per_trigger``
per batch with no trigger interval, and is timed by its progress's timestamps.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bench.common import BenchRun, epoch_s, read_all_with_kafka_python, read_to, ticking, topic_end_offsets
from simulation.mailbox import Platform
from simulation.workload import Workload, played
from purger.streams.candidates import candidates_stream
from purger.streams.checkpoint import AVRO, ENCODING_CONF, UNSAFEROW
from purger.streams.parse import parse_events
from purger.streams.processor import routed
from purger.running import start_purger
from purger.sinks.ledger import Ledger
from purger.streams.source import read_records

RETENTION = {"expired_ttl": "10s", "incomplete_ttl": "10s", "deleted_ttl": "0s", "payload_grace": "2s"}


def produce(run: BenchRun, messages: int) -> tuple[int, float]:
    """The workload's events, 5% late and 5% twice; (events, seconds)."""
    platform = Platform(run.config, events_only=True)
    workload = Workload(late_share=0.05, duplicate_share=0.05)
    started = time.perf_counter()
    held = []
    for plan in workload.plans(run.run, messages):
        _, events = played(platform, plan)
        if plan.late:
            held.extend(events)  # sent after all the others
        else:
            platform.send(events)
    platform.send(held)
    platform.close()
    return sum(topic_end_offsets(run.config).values()), time.perf_counter() - started


def timed(run: BenchRun, name: str, outputs: DataFrame, output_mode: str) -> float:
    """Run ``outputs`` into the noop sink from a fresh checkpoint until it has read the whole topic."""
    ends = topic_end_offsets(run.config)
    query = (outputs.writeStream.queryName(f"{run.run}-{name}").format("noop").outputMode(output_mode)
             .option("checkpointLocation", str(run.work / f"checkpoint-{name}")).start())
    try:
        with ticking(run.config):
            return read_to(query, ends)
    finally:
        query.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--no-replay", dest="replay", action="store_false",
                        help="stop after the stateful stage (to compare settings of the stage alone)")
    parser.add_argument("--encodings", default=f"{UNSAFEROW},{AVRO}",
                        help="the state encodings to run the stateful stage with, in this order")
    args = parser.parse_args()
    run = BenchRun.start("stateful", policies={"mailbox": RETENTION})
    config = run.config
    events, seconds = produce(run, args.messages)
    run.record("workload generator (events only)", events / seconds, "events/s", events=events)

    read, seconds = read_all_with_kafka_python(config)
    kafka_rate = read / seconds
    run.record("plain Kafka read (kafka-python)", kafka_rate, "events/s", events=read)

    spark = run.spark()
    policies = config.policy_set
    parsed = parse_events(read_records(spark, config), config.kafka.written_by_purger, policies)
    native = routed(parsed, policies).groupBy("kind", "id").agg(F.count(F.lit(1)).alias("events"),
                                                       F.max("event_time_ms").alias("latest_ms"))
    # Spark's aggregation keeps its state in unsaferow only (the purger's session says Avro: purger.spark).
    spark.conf.set(ENCODING_CONF, UNSAFEROW)
    native_rate = events / timed(run, "native", native, "update")
    run.record("native Spark aggregation", native_rate, "events/s", events=events)

    # The state's encoding, Avro (the purger's, so that a state can gain a field) beside Spark's default.
    for encoding in args.encodings.split(","):
        spark.conf.set(ENCODING_CONF, encoding)
        stateful_rate = events / timed(run, f"stateful-{encoding}", candidates_stream(spark, config), "append")
        run.record(f"stateful stage (transformWithState, {encoding} state)", stateful_rate, "events/s",
                   baseline=("native Spark aggregation", native_rate), target=">= 0.8x", events=events,
                   spark_submit_args=os.environ.get("PYSPARK_SUBMIT_ARGS"))
    if not args.replay:
        return
    spark.conf.set(ENCODING_CONF, AVRO)  # the purger's, whichever ran last

    running = start_purger(spark, config)
    try:
        read_s = read_to(running.query, topic_end_offsets(config))
        run.record("replay from the earliest offset: read", events / read_s, "events/s",
                   baseline=("plain Kafka read", kafka_rate), target=">= 0.5x", events=events)
        decided_s = _decided(running.query)
        run.record("replay from the earliest offset: every candidate decided", decided_s, "s", events=events,
                   target="< 150 s at 100,000 messages",
                   outcomes=dict((f"{k}/{s}", n) for (k, s), n in running.sink.totals.items()))
        for kind, batches, decisions, seconds in _decisions_by_kind(Ledger(spark, config.ledger)):
            run.record(f"replay from the earliest offset: {kind} decisions, first to last", decisions / seconds,
                       "decisions/s", decisions=decisions, seconds=round(seconds, 1), batches=batches)
    finally:
        running.stop()


def _decisions_by_kind(ledger: Ledger) -> list[tuple[str, list[int], int, float]]:
    """Per kind, from the ledger: the batches that decided it, how many decisions, and the seconds from the
    first to the last (a message's payload is decided in a batch after the message's)."""
    found = (ledger.records().groupBy("kind")
             .agg(F.sort_array(F.collect_set("batch_id")).alias("batches"), F.count(F.lit(1)).alias("decisions"),
                  (F.max("decided_at").cast("double") - F.min("decided_at").cast("double")).alias("seconds"))
             .orderBy("kind").collect())
    return [(r["kind"], list(r["batches"]), r["decisions"], max(r["seconds"], 0.001)) for r in found]


def _decided(query, timeout_s: float = 1800) -> float:
    """Seconds from the replay's start to the end of its last batch with candidates, once a later batch
    (the clock ticks once the replay has caught up) had none: every candidate is then decided."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        progress = [json.loads(p.json) for p in query.recentProgress]
        counts = [sum(p.get("observedMetrics", {}).get("purger", {}).get(name, 0)
                      for name in ("message_candidates", "payload_candidates")) for p in progress]
        last = max((i for i, n in enumerate(counts) if n), default=None)
        if last is not None and any(n == 0 for n in counts[last + 1:]):
            end = progress[last]
            return (epoch_s(end["timestamp"]) + end["durationMs"]["triggerExecution"] / 1000
                    - epoch_s(progress[0]["timestamp"]))
        time.sleep(1)
    raise TimeoutError(f"the replay's candidates were not all decided in {timeout_s} s")


if __name__ == "__main__":
    main()
