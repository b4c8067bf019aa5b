"""Double-checked deletions per second end to end, beside a plain cassandra-driver loop of the same deletes.

    python -m bench.deletes --messages 20000

The platform writes twice ``--messages`` messages that expire by counter (rows,
references, inline payloads, so Cassandra's delete path alone is measured),
one half with its events on the purger's topic, the other half on a topic no
one reads. Once they are all due:

1. the baselines delete the second half with ``execute_concurrent_with_args``,
   ``--baseline-concurrency`` in flight: one quarter of the messages by the same
   conditional ``DELETE ... IF extract_count = 0 AND updated_at <= ?`` alone (the
   ceiling of the delete path), the other quarter by it and the delete of the
   message's ``payload_refs`` row (the same statements as the purger);
2. the purger runs on the first half: events read, timers fired, candidates
   double-checked and deleted with their references, every outcome in the ledger.
   The rate is purged messages over the span of their ``deleted_at`` in the
   ledger; the end-to-end time runs from the query's start to the last deletion.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime, timedelta, timezone

from cassandra.concurrent import execute_concurrent_with_args
from pyspark.sql import functions as F

from bench.common import BenchRun
from purger.connectors import cassandra_session
from simulation.mailbox import Platform
from devstack.stack import prepare
from simulation.workload import EXPIRED_ONLY, Workload, play_all
from purger.sinks.ledger import Ledger
from purger.running import start_purger
from purger.policies.mailbox.rules import EXPIRED_BY_COUNTER

EXPIRED_TTL = timedelta(seconds=5)


def write(run: BenchRun, name: str, messages: int, topic: str) -> dict[str, str]:
    """Write expired messages through the platform; message id -> payload id."""
    config = run.config.model_copy(update={"kafka": run.config.kafka.model_copy(update={"topics": [topic]})})
    prepare(config)
    platform = Platform(config)
    workload = Workload(mix=EXPIRED_ONLY, shared_share=0, inline_share=1.0)
    started = time.perf_counter()
    try:
        written = play_all(platform, workload.plans(f"{run.run}-{name}", messages), threads=16)
    finally:
        platform.close()
    run.record(f"workload generator, {name} (rows and events)", messages / (time.perf_counter() - started),
               "messages/s", messages=messages)
    return written


def plain_driver_loop(run: BenchRun, messages: dict[str, str], concurrency: int, references: bool) -> float:
    """Deletions per second of ``execute_concurrent_with_args``: the conditional deletes, and with
    ``references`` also each message's reference row (the purger's statements for an inline payload)."""
    cassandra = run.config.cassandra
    session = cassandra_session(cassandra, cassandra.keyspace)
    mailbox = run.config.policy_set.policy_of("message")
    rule = mailbox.retention.message_rules[EXPIRED_BY_COUNTER]
    delete = session.prepare(f"DELETE FROM {mailbox.settings.messages_table} WHERE message_id = ? IF {rule.condition}")
    delete_ref = session.prepare(
        f"DELETE FROM {mailbox.settings.payload_refs_table} WHERE payload_id = ? AND message_id = ?")
    cutoff = datetime.now(timezone.utc) - EXPIRED_TTL
    started = time.perf_counter()
    results = execute_concurrent_with_args(session, delete, [(m, cutoff) for m in messages],
                                           concurrency=concurrency, raise_on_first_error=True)
    if references:
        execute_concurrent_with_args(session, delete_ref, [(p, m) for m, p in messages.items()],
                                     concurrency=concurrency, raise_on_first_error=True)
    seconds = time.perf_counter() - started
    applied = sum(result.result_or_exc.was_applied for result in results)
    session.cluster.shutdown()
    if applied != len(messages):
        raise RuntimeError(f"the baseline deleted {applied} of {len(messages)} rows")
    return applied / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--baseline-concurrency", type=int, default=64)
    parser.add_argument("--delete-concurrency", type=int, default=16, help="stream.delete_concurrency")
    args = parser.parse_args()
    run = BenchRun.start(
        "deletes",
        policies={"mailbox": {"expired_ttl": f"{EXPIRED_TTL.total_seconds():.0f}s"}},
        stream={"trigger_interval": "1s", "watermark_delay": "2s", "clock_interval": "1s",
                "max_deletions_per_second": 1_000_000, "delete_concurrency": args.delete_concurrency},
    )
    config = run.config
    purged = write(run, "purger", args.messages, config.kafka.topics[0])
    baseline = write(run, "baseline", args.messages, f"bench.{run.run}.unread")
    time.sleep(EXPIRED_TTL.total_seconds() + 1)

    half = dict(list(baseline.items())[: len(baseline) // 2])
    plain_rate = plain_driver_loop(run, half, args.baseline_concurrency, references=False)
    run.record("plain cassandra-driver conditional deletes", plain_rate, "deletions/s",
               concurrency=args.baseline_concurrency, messages=len(half))
    other_half = {m: p for m, p in baseline.items() if m not in half}
    same_work_rate = plain_driver_loop(run, other_half, args.baseline_concurrency, references=True)
    run.record("plain cassandra-driver conditional deletes and reference deletes", same_work_rate, "deletions/s",
               concurrency=args.baseline_concurrency, messages=len(other_half))

    spark = run.spark()
    running = start_purger(spark, config)
    started = time.time()
    try:
        deadline = time.monotonic() + 1800
        while running.sink.totals[("message", "purged")] < len(purged) and time.monotonic() < deadline:
            if running.query.exception() is not None:
                raise RuntimeError(f"the purger failed: {running.query.exception()}")
            time.sleep(0.5)
    finally:
        running.stop()
    deletions = (Ledger(spark, config.ledger).records()
                 .where((F.col("kind") == "message") & (F.col("status") == "purged"))
                 .agg(F.count(F.lit(1)).alias("n"), F.min("deleted_at").alias("first"),
                      F.max("deleted_at").alias("last"))
                 .first())
    if deletions["n"] != len(purged):
        raise RuntimeError(f"the purger deleted {deletions['n']} of {len(purged)} messages")
    span = (deletions["last"] - deletions["first"]).total_seconds()
    rate = deletions["n"] / span
    run.record("purger double-checked deletions", rate, "deletions/s",
               baseline=("plain cassandra-driver conditional deletes", plain_rate), target=">= 0.7x",
               delete_concurrency=args.delete_concurrency, messages=deletions["n"])
    run.record("purger double-checked deletions, against the same statements", rate, "deletions/s",
               baseline=("plain cassandra-driver conditional deletes and reference deletes", same_work_rate),
               delete_concurrency=args.delete_concurrency, messages=deletions["n"])
    end_to_end = deletions["last"].replace(tzinfo=timezone.utc).timestamp() - started
    run.record("purger end to end (query start to last deletion)", end_to_end, "s", messages=deletions["n"])


if __name__ == "__main__":
    main()
