"""A purger started on a backlog (SPEC 10.1): what is due at the head goes before the tail is read.

    python -m bench.backlog --head 2000 --recent 60000 --tail 20 --max-offsets 2000

The platform writes, before the purger starts: ``--head`` messages due for
weeks (enqueued and dequeued eight weeks ago, inline: no blob; the default
TTL is 30 days), then ``--recent`` events of messages that stay live, then
``--tail`` more messages due for weeks. The purger starts from the earliest offsets reading at most
``--max-offsets`` records a batch (``kafka.max_offsets_per_trigger``), so the
backlog takes many batches. Timed from the query's first batch, by the
ledger's ``deleted_at`` and the query's own progress: the head's last
deletion, the batch that read the events topic to its end, the tail's last
deletion. The target: the head purged in under half the time it takes to
reach the tail (before the clock ticked at the Kafka time read, nothing was
purged until the whole backlog was read: the head and the tail went
together).

Every head and tail message is checked gone from Cassandra, with one
``purged`` record each, and none of the recent messages' rows deleted.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone

from pyspark.sql import functions as F

from bench.common import BenchRun, epoch_s, has_read, read_to, topic_end_offsets
from purger.running import start_purger
from purger.sinks.ledger import Ledger
from simulation.mailbox import Platform


def write_due(platform: Platform, prefix: str, count: int, at: datetime) -> list[str]:
    """``count`` inline messages whose counter reached zero at ``at``: due since ``at`` plus the TTL."""
    messages = [f"{prefix}-{i}" for i in range(count)]
    for m in messages:
        platform.enqueue(m, f"p-{m}", size=16, at=at)
        platform.dequeue(m, 0, at=at)
    platform.flush()
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--head", type=int, default=2000, help="messages due for weeks at the backlog's head")
    parser.add_argument("--recent", type=int, default=60000, help="live messages' events behind them")
    parser.add_argument("--tail", type=int, default=20, help="messages due for weeks at the backlog's tail")
    parser.add_argument("--max-offsets", type=int, default=2000, help="kafka.max_offsets_per_trigger")
    args = parser.parse_args()
    run = BenchRun.start("backlog", kafka={"max_offsets_per_trigger": args.max_offsets})
    config = run.config
    spark = run.spark()
    platform, recent = Platform(config), Platform(config, events_only=True)
    long_ago = datetime.now(timezone.utc) - timedelta(weeks=8)
    tag = uuid.uuid4().hex[:6]
    head = write_due(platform, f"head-{tag}", args.head, long_ago)
    live = [f"recent-{tag}-{i}" for i in range(args.recent)]
    for m in live:
        recent.enqueue(m, f"p-{m}", size=16)  # never due: its counter stays at 1
    recent.flush()
    tail = write_due(platform, f"tail-{tag}", args.tail, long_ago)
    ends = topic_end_offsets(config)
    print(f"backlog written: {sum(ends.values()):,} events", flush=True)

    running = start_purger(spark, config, starting_offsets="earliest")
    try:
        reached_s = read_to(running.query, ends)
        deadline = time.monotonic() + 600
        while any(platform.row(m) is not None for m in tail) and time.monotonic() < deadline:
            time.sleep(1)
        progress = [json.loads(p.json) for p in running.query.recentProgress]
    finally:
        running.stop()
    first_batch_s = epoch_s(progress[0]["timestamp"])
    batches_to_end = next(i for i, p in enumerate(progress) if has_read(p, ends)) + 1

    records = (Ledger(spark, config.ledger).records()
               .where((F.col("status") == "purged") & (F.col("kind") == "message"))
               .select("id", F.col("deleted_at").cast("double").alias("deleted_s")).collect())
    deleted = {r["id"]: r["deleted_s"] for r in records}
    doubled = sum(n > 1 for n in Counter(r["id"] for r in records).values())
    left = [m for m in head + tail if platform.row(m) is not None or m not in deleted]
    live_deleted = sum(m in deleted for m in live)
    platform.close()
    recent.close()
    if left or doubled or live_deleted:
        raise SystemExit(f"end state wrong: {len(left)} due messages left or unrecorded, {doubled} recorded "
                         f"twice, {live_deleted} live ones deleted")
    head_s = max(deleted[m] for m in head) - first_batch_s
    head_first_s = min(deleted[m] for m in head) - first_batch_s
    tail_s = max(deleted[m] for m in tail) - first_batch_s
    details = dict(head=args.head, recent=args.recent, tail=args.tail, max_offsets_per_trigger=args.max_offsets,
                   events=sum(ends.values()), batches_to_end=batches_to_end)
    run.record("backlog: the head's first due message purged", head_first_s, "s", **details)
    run.record("backlog: the head's due messages purged", head_s, "s",
               baseline=("the backlog read to its end", reached_s), target="< 0.5x", **details)
    run.record("backlog: the tail's due messages purged", tail_s, "s",
               baseline=("the backlog read to its end", reached_s), **details)


if __name__ == "__main__":
    main()
