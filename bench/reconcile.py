"""Reconciliation at scale: the scan's rate beside a plain cassandra-driver scan, a bootstrap of existing data
to its last deletion, a steady-state reconcile, and the driver's peak memory in each.

    python -m bench.reconcile --messages 1000000

The platform's rows are written straight into a keyspace and buckets of the run's own, with no events, as on
a platform the purger has never seen: ``--messages`` messages written 40 days ago, every other one due (its
counter 0, past ``expired_ttl``), the rest live. Most payloads are inline; per ``--blob-every`` messages six
have blobs in both data centres: a due and a live message with a blob each, a due and a live one sharing a
blob (kept), and two due ones sharing a blob (purged). Then:

1. **baseline**: one process scans the ``messages`` table by token range with cassandra-driver
   (``--baseline-threads`` threads over ``--ranges`` ranges, the reconcile's page size and columns);
2. **scan**: ``purger reconcile --dry-run`` over the same table (no state yet: every row is unknown);
   its rows per second from the report, against the baseline (target at least 0.8x); and the scan
   alone, the reconcile's own Spark tasks reading the same ranges through the same sessions and counting
   rows, with no re-expression, judgement or feed: what the Spark side costs apart from the policy's work;
3. **bootstrap**: the purger runs, and a reconcile feeds every row back (in the reconciles' scheduler pool, as
   ``purger run`` schedules one); timed from the reconcile's start to the last deletion of an existing object
   in the ledger. Every due message and purged payload gone, every live one intact. Meanwhile the platform
   goes on: new messages (the default workload, ``--live-rate`` a second, retention periods of seconds) are
   written with their events, and the purge lag of those that
   came due during the bootstrap (the ledger's ``lag_s``) says whether the purger stays live during a
   catch-up (target: p99 under 60 s), over all of it and over its first 10 minutes (the scan and feed beside
   the batches) and the rest apart;
4. **steady state**: a second reconcile of the same objects, the purger still running: its time, and what
   it feeds back (target: nothing).

The driver's peak resident memory (this process, and the JVM, which in local mode also runs the tasks) is
recorded for each step: run at two sizes to see whether it grows with the table.
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator
from datetime import datetime, timedelta, timezone

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
import numpy as np
from cassandra.query import PreparedStatement
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from bench.common import BenchRun, PeakMemory, epoch_s, job_steps, overrides, spark_jobs
from devstack.stack import prepare
from simulation.mailbox import Platform
from simulation.workload import MessagePlan, Workload, is_purged, play_all
from purger.connectors import cassandra_session, s3_client
from purger.reconcile.token_ranges import scan_pages, scan_plan
from purger.core.settings import PurgerConfig
from purger.policies.mailbox.deletes import payload_key
from purger.reconcile.run import reconcile
from purger.running import RECONCILE_JOB_GROUP, set_up_thread, start_purger
from purger.sinks.clients import executor_session
from purger.sinks.ledger import Ledger

WRITTEN_AGO = timedelta(days=40)
MIN_TOKEN, MAX_TOKEN = -(2**63), 2**63 - 1


class Objects:
    """The existing objects: message id -> due, and the blob payloads that must go or stay."""

    def __init__(self, messages: int, blob_every: int) -> None:
        self.messages = {f"m{i:08d}": i % 2 == 0 for i in range(messages)}
        self.payload_of: dict[str, str] = {}
        self.purged_payloads: set[str] = set()
        self.kept_payloads: set[str] = set()
        for i in range(messages):
            m, slot, group = f"m{i:08d}", i % blob_every, i // blob_every
            if slot in (0, 1):  # its own blob: due (0) or live (1)
                self.payload_of[m] = f"own-{m}"
                (self.purged_payloads if slot == 0 else self.kept_payloads).add(f"own-{m}")
            elif slot in (2, 3):  # a due and a live message sharing a blob
                self.payload_of[m] = f"kept-{group}"
                self.kept_payloads.add(f"kept-{group}")
            elif slot in (4, 6):  # two due messages sharing a blob
                self.payload_of[m] = f"gone-{group}"
                self.purged_payloads.add(f"gone-{group}")

    @property
    def due(self) -> int:
        return sum(self.messages.values())


def write_existing(config: PurgerConfig, objects: Objects) -> float:
    """Rows, references, payload rows and blobs, no events; returns messages written per second."""
    mailbox = config.policy_set.policy_of("message").settings
    session = cassandra_session(config.cassandra, config.cassandra.keyspace)
    at = datetime.now(timezone.utc) - WRITTEN_AGO
    insert_message = session.prepare(
        f"INSERT INTO {mailbox.messages_table} (message_id, mailbox, payload_id, payload_size, inline_payload, "
        "extract_count, complete, deleted, created_at, updated_at) VALUES (?, 'inbox', ?, ?, ?, ?, true, false, ?, ?)")
    insert_ref = session.prepare(f"INSERT INTO {mailbox.payload_refs_table} (payload_id, message_id) VALUES (?, ?)")
    insert_payload = session.prepare(
        f"INSERT INTO {mailbox.payloads_table} (payload_id, size, dcs, state, last_ref_at, created_at) "
        "VALUES (?, ?, ?, 'live', ?, ?)")
    blob = b"b" * 16 * 1024
    started = time.perf_counter()
    messages, refs = [], []
    for m, due in objects.messages.items():
        payload = objects.payload_of.get(m, f"inline-{m}")
        inline = None if m in objects.payload_of else b"i" * 64
        messages.append((m, payload, len(blob) if inline is None else 64, inline, 0 if due else 1, at, at))
        refs.append((payload, m))
    blob_payloads = sorted(objects.purged_payloads | objects.kept_payloads)
    for statement, rows in ((insert_message, messages), (insert_ref, refs),
                            (insert_payload, [(p, len(blob), set(config.stores), at, at) for p in blob_payloads])):
        insert_all(session, statement, rows)
    session.cluster.shutdown()
    stores = {dc: (s3_client(store), store.bucket) for dc, store in config.stores.items()}
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda job: job[0].put_object(Bucket=job[1], Key=payload_key(job[2]), Body=blob),
                      [(client, bucket, p) for client, bucket in stores.values() for p in blob_payloads]))
    return len(objects.messages) / (time.perf_counter() - started)


def insert_all(session: Session, statement: PreparedStatement, rows: list[tuple], attempts: int = 5) -> None:
    """Every row inserted, 50,000 at a time, 64 in flight; the inserts a loaded node timed out are sent
    again (they are idempotent)."""
    for start in range(0, len(rows), 50_000):
        todo = rows[start:start + 50_000]
        for _ in range(attempts):
            results = execute_concurrent_with_args(session, statement, todo, concurrency=64,
                                                   raise_on_first_error=False)
            todo = [row for row, (ok, _) in zip(todo, results) if not ok]
            if not todo:
                break
        else:
            raise RuntimeError(f"{len(todo)} inserts still failing after {attempts} attempts")


def plain_driver_scan(config: PurgerConfig, threads: int, ranges: int) -> tuple[int, float]:
    """Baseline: the ``messages`` table read whole by ``ranges`` equal token ranges, ``threads`` at a time,
    paged, in this process; (rows, seconds)."""
    policy = config.policy_set.policy_of("message")
    scanned = next(s for s in policy.scanned if s.table == "messages")
    session = cassandra_session(config.cassandra, config.cassandra.keyspace)
    select = session.prepare(
        f"SELECT {', '.join(scanned.selected)} FROM {policy.settings.messages_table} "
        f"WHERE token({scanned.id_column}) > ? AND token({scanned.id_column}) <= ?")
    select.fetch_size = config.reconcile.page_size
    step = (MAX_TOKEN - MIN_TOKEN) // ranges
    bounds = [MIN_TOKEN + i * step for i in range(ranges)] + [MAX_TOKEN]
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for start, end in zip(bounds, bounds[1:]):
        todo.put((start, end))
    counts = [0] * threads

    def scan(worker: int) -> None:
        while True:
            try:
                token_range = todo.get_nowait()
            except queue.Empty:
                return
            for _ in session.execute(select, token_range):
                counts[worker] += 1

    started = time.perf_counter()
    workers = [threading.Thread(target=scan, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - started
    session.cluster.shutdown()
    return sum(counts), seconds


def spark_scan_alone(spark: SparkSession, config: PurgerConfig) -> tuple[int, float]:
    """The reconcile's scan of ``messages`` (its plan, tasks, sessions and paging), counting rows and doing
    nothing else; (rows, seconds)."""
    policy = config.policy_set.policy_of("message")
    scanned = next(s for s in policy.scanned if s.table == "messages")
    table = policy.settings.messages_table
    settings = config.reconcile
    cores = spark.sparkContext.defaultParallelism
    plan = scan_plan(config.cassandra, table, cores, settings)

    def count(task_ranges: Iterator[tuple[int, int]]) -> Iterator[int]:
        session = executor_session(config)
        yield sum(len(rows) for _, rows in scan_pages(session, config.cassandra.keyspace, table, plan.key,
                                                      list(scanned.selected), list(task_ranges), settings.consistency,
                                                      settings.page_size))

    started = time.perf_counter()
    rows = spark.sparkContext.parallelize(plan.ranges, plan.tasks).mapPartitions(count).sum()
    return rows, time.perf_counter() - started


# The bootstrap's first minutes, whose new messages' lag is recorded apart.
FIRST_S = 600


class LivePlatform:
    """The platform at work beside a bootstrap: the default workload's new messages (none late: their events go
    as their rows are written), ``rate`` a second, written with their events on a thread of its own until
    ``stop``; their ids start with ``prefix``. A message whose write fails (Cassandra timing out under the
    bootstrap) is counted in ``failures`` and left out: the next ones go on."""

    def __init__(self, config: PurgerConfig, prefix: str, rate: float) -> None:
        self.prefix = prefix
        self.played: list[MessagePlan] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._platform = Platform(config)
        self._thread = threading.Thread(target=self._play, args=(rate,), name="live platform", daemon=True)
        self._thread.start()

    def _plans(self) -> Iterator[MessagePlan]:
        for plan in Workload(duplicate_share=0.05).plans(self.prefix, 10**8):
            if self._stop.is_set():
                return
            yield plan

    def _play(self, rate: float) -> None:
        plans = self._plans()
        while not self._stop.is_set():
            try:
                play_all(self._platform, plans, rate=rate, on_played=lambda plan, _: self.played.append(plan))
            except Exception as error:  # the plans that failed are dropped; play_all goes on with the next ones
                self.failures.append(f"{type(error).__name__}: {error}")
                if len(self.failures) > 1000:
                    raise

    def stop(self) -> int:
        """Stops writing; the number of messages written due to be purged."""
        self._stop.set()
        self._thread.join()
        self._platform.close()
        return sum(is_purged(plan.scenario) for plan in self.played)


def record_memory(run: BenchRun, step: str, memory: PeakMemory, rows: int) -> None:
    """The driver's peak during a step: its JVM's resident memory (in local mode the tasks' too), and how
    far this Python process grew (it holds the benchmark's own lists of objects, written before)."""
    run.record(f"driver JVM peak memory, {step}", memory.peak.get("java", 0.0), "MiB", rows=rows,
               python_growth_mb=round(memory.own_growth_mb), processes_mb={k: round(v) for k, v in memory.peak.items()})


def payloads_left(config: PurgerConfig, objects: Objects) -> list[str]:
    """The payloads due to go that still have a row or a blob."""
    mailbox = config.policy_set.policy_of("message").settings
    session = cassandra_session(config.cassandra, config.cassandra.keyspace)
    rows = {row.payload_id for row in session.execute(f"SELECT payload_id FROM {mailbox.payloads_table}")}
    session.cluster.shutdown()
    keys: set[str] = set()
    for store in config.stores.values():
        for page in s3_client(store).get_paginator("list_objects_v2").paginate(Bucket=store.bucket):
            keys |= {item["Key"] for item in page.get("Contents", [])}
    return [p for p in objects.purged_payloads if p in rows or payload_key(p) in keys]


def present_messages(config: PurgerConfig) -> set[str]:
    """The ids of the messages table's rows."""
    mailbox = config.policy_set.policy_of("message").settings
    session = cassandra_session(config.cassandra, config.cassandra.keyspace)
    present = {row.message_id for row in session.execute(f"SELECT message_id FROM {mailbox.messages_table}")}
    session.cluster.shutdown()
    return present


def due_left(objects: Objects, present: set[str]) -> list[str]:
    """The due messages among ``present``."""
    return [m for m, due in objects.messages.items() if due and m in present]


def remaining(config: PurgerConfig, objects: Objects) -> tuple[list[str], list[str], list[str], list[str]]:
    """What the bootstrap left wrong: due messages still there, live ones gone, purged payloads with a row
    or blob left, kept payloads without theirs."""
    mailbox = config.policy_set.policy_of("message").settings
    present = present_messages(config)
    session = cassandra_session(config.cassandra, config.cassandra.keyspace)
    payload_rows = {row.payload_id for row in session.execute(f"SELECT payload_id FROM {mailbox.payloads_table}")}
    session.cluster.shutdown()
    blobs: dict[str, set[str]] = {}
    for dc, store in config.stores.items():
        client, keys = s3_client(store), set()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket):
            keys |= {item["Key"] for item in page.get("Contents", [])}
        blobs[dc] = keys
    left_due = due_left(objects, present)
    live_gone = [m for m, due in objects.messages.items() if not due and m not in present]
    payload_left = [p for p in objects.purged_payloads
                    if p in payload_rows or any(payload_key(p) in keys for keys in blobs.values())]
    payload_gone = [p for p in objects.kept_payloads
                    if p not in payload_rows or not all(payload_key(p) in keys for keys in blobs.values())]
    return left_due, live_gone, payload_left, payload_gone


def bootstrap_profile(run: BenchRun, spark: SparkSession, query: StreamingQuery, start_s: float, end_s: float) -> None:
    """What the bootstrap's batches were made of: their duration and input rows (the query's progress) and the
    median of each step's Spark jobs (the sink's purge and ledger), for the batches from ``start_s`` to
    ``end_s`` (epoch seconds)."""
    progress = [p for p in (json.loads(p.json) for p in query.recentProgress)
                if start_s <= epoch_s(p["timestamp"]) <= end_s and p["numInputRows"]
                and "triggerExecution" in p["durationMs"]]  # not in the progress of a batch cut short by a stop
    durations = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    run.record("bootstrap batch duration p50 (triggerExecution)", float(np.median(durations)), "s",
               batches=len(progress), input_rows_p50=float(np.median([p["numInputRows"] for p in progress])))
    jobs = [job for job in spark_jobs(spark, start_s * 1000) if job["end_ms"] <= end_s * 1000]
    for step, seconds in sorted(job_steps(jobs).items()):
        run.record(f"bootstrap batch step median ({step} job)", seconds, "s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--blob-every", type=int, default=1000, help="six messages in each so many have blobs")
    parser.add_argument("--baseline-threads", type=int, default=4)
    parser.add_argument("--ranges", type=int, default=64, help="token ranges of the baseline's scan")
    parser.add_argument("--scan-only", action="store_true", help="stop after the scan's figures (steps 1 and 2)")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds the bootstrap may take")
    parser.add_argument("--live-rate", type=float, default=5, help="new messages a second during the bootstrap")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting other than the run's, e.g. kafka.reconcile_max_offsets_per_trigger=5000")
    parser.add_argument("--reuse", metavar="TAG", help="the existing data of an earlier --scan-only run of the same "
                        "--messages and --blob-every (its keyspace bench_reconcile_TAG), not written again; a "
                        "bootstrap purges it, so it can be reused only until one runs")
    args = parser.parse_args()
    tag = args.reuse or uuid.uuid4().hex[:6]
    sections = {
        "cassandra": {"keyspace": f"bench_reconcile_{tag}"},
        "stores": {dc: {"bucket": f"bench-reconcile-{tag}-{dc}"} for dc in ("dc1", "dc2")},
        # The new messages of the bootstrap's step come due in seconds (as in bench.lag); the existing ones are
        # 40 days old, due or live whatever the periods.
        "policies": {"mailbox": {"expired_ttl": "20s", "incomplete_ttl": "20s", "deleted_ttl": "0s",
                                 "payload_grace": "5s"}},
        "stream": {"trigger_interval": "1s", "clock_interval": "1s", "max_deletions_per_second": 1_000_000},
        "reconcile": {"interval": "0", "max_rows_per_second": 1_000_000_000},
    }
    for section, settings in overrides(args.set).items():
        sections[section] = {**sections.get(section, {}), **settings}
    run = BenchRun.start("reconcile", **sections)
    config = run.config
    prepare(config)
    objects = Objects(args.messages, args.blob_every)
    if not args.reuse:
        rate = write_existing(config, objects)
        run.record("existing data written (rows, references, blobs; no events)", rate, "messages/s",
                   messages=args.messages)

    rows, seconds = plain_driver_scan(config, args.baseline_threads, args.ranges)
    if rows != args.messages:
        raise RuntimeError(f"the baseline scan read {rows} of {args.messages} rows")
    plain_rate = rows / seconds
    run.record("plain cassandra-driver token-range scan of messages", plain_rate, "rows/s", rows=rows,
               threads=args.baseline_threads, ranges=args.ranges)

    spark = run.spark()
    with PeakMemory() as memory:
        report = reconcile(spark, config, ["mailbox"], dry_run=True)
    scan = next(row for row in report if row.table == "messages")
    if scan.scanned != args.messages:
        raise RuntimeError(f"the reconcile scanned {scan.scanned} of {args.messages} rows")
    rows, seconds = spark_scan_alone(spark, config)
    run.record("the reconcile's Spark scan alone (no re-expression, no feed), messages", rows / seconds, "rows/s",
               baseline=("plain cassandra-driver token-range scan of messages", plain_rate), rows=rows)
    run.record("purger reconcile --dry-run, messages", scan.rows_per_s, "rows/s",
               baseline=("plain cassandra-driver token-range scan of messages", plain_rate), target=">= 0.8x",
               rows=scan.scanned, unknown=scan.unknown_fed, overdue=scan.overdue_fed)
    record_memory(run, "dry-run reconcile", memory, args.messages)
    if args.scan_only:
        return

    running = start_purger(spark, config)
    # From here this thread's jobs are a scheduled reconcile's, in its pool beside the batches (as in purger run).
    set_up_thread(spark, RECONCILE_JOB_GROUP, "reconcile")
    try:
        # Decided: purged, or found gone after a delete whose outcome a timeout hid (RELIABILITY.md).
        decided = lambda: (running.sink.totals[("message", "purged")]  # noqa: E731
                           + running.sink.totals[("message", "already_gone")])
        live = LivePlatform(config, f"live-{run.run}", args.live_rate)
        started = time.time()
        with PeakMemory() as memory:
            report = reconcile(spark, config, ["mailbox"])
            fed = next(row for row in report if row.table == "messages")
            run.record("bootstrap reconcile, messages (scan and feed)", fed.rows_per_s, "rows/s",
                       rows=fed.scanned, unknown=fed.unknown_fed, overdue=fed.overdue_fed)
            deadline = time.monotonic() + args.timeout
            # The sink's totals count the new messages too: at the existing ones' count, the table says.
            while decided() < objects.due or due_left(objects, present_messages(config)):
                if running.query.exception() is not None:
                    raise RuntimeError(f"the purger failed: {running.query.exception()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{decided()} of {objects.due} due messages decided")
                time.sleep(1 if decided() < objects.due else 15)
            while payloads_left(config, objects) and time.monotonic() < deadline:
                time.sleep(5)  # the payloads follow their last reference after payload_grace
            polled_s = time.time() - started
        live_due = live.stop()
        left_due, live_gone, payload_left, payload_gone = remaining(config, objects)
        record_memory(run, "bootstrap", memory, args.messages)
        if left_due or live_gone or payload_left or payload_gone:
            raise RuntimeError(f"wrong end state: {len(left_due)} due left, {len(live_gone)} live deleted, "
                               f"{len(payload_left)} payloads left, {len(payload_gone)} kept payloads deleted")
        # The new messages written up to the bootstrap's end purged too (their payloads then follow).
        while decided() < objects.due + live_due and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(30)
        deleted = (Ledger(spark, config.ledger).records().where(F.col("status") == "purged")
                   .select("kind", "id", "dc", "lag_s", F.col("deleted_at").cast("double").alias("deleted_s"))
                   .collect())
        existing = [r for r in deleted if not r["id"].startswith(live.prefix)]
        bootstrap_s = max(r["deleted_s"] for r in existing) - started
        run.record("bootstrap: reconcile start to last deletion", bootstrap_s, "s", messages=args.messages,
                   due=objects.due, due_left=len(left_due), live_deleted=len(live_gone),
                   purged_payloads_left=len(payload_left), kept_payloads_deleted=len(payload_gone),
                   deletions_per_s=round(objects.due / bootstrap_s, 1), polled_s=round(polled_s, 1), settings=args.set,
                   **{f"message_{status}": running.sink.totals[("message", status)]
                      for status in ("purged", "already_gone", "error")})
        new = [r for r in deleted if r["id"].startswith(live.prefix) and r["kind"] == "message"]
        # Each new message's lag by when it came due, from the reconcile's start: all of the bootstrap, and its
        # first minutes (the scan and feed run beside the batches) apart from the rest.
        due_s = [(r["deleted_s"] - r["lag_s"] - started, r["lag_s"]) for r in new]
        spans = [("", (50, 99), -np.inf, bootstrap_s),
                 (f", first {FIRST_S // 60} min", (99,), -np.inf, FIRST_S),
                 (f", after the first {FIRST_S // 60} min", (99,), FIRST_S, bootstrap_s)]
        floor = config.stream.watermark_delay.total_seconds() + config.stream.trigger_interval.total_seconds()
        if len(new) < live_due:
            raise RuntimeError(f"{len(new)} of the {live_due} new messages due purged")
        for span, percentiles, since, until in spans:
            during = np.array([lag for at, lag in due_s if since < at <= until])
            for p in percentiles if len(during) else ():  # none after a bootstrap shorter than its first minutes
                run.record(f"purge lag p{p} of new messages during the bootstrap{span}",
                           float(np.percentile(during, p)), "s", baseline=("watermark delay + trigger interval", floor),
                           target="< 60 s" if p == 99 else None, deletions=len(during), live_rate=args.live_rate,
                           messages=args.messages, platform_write_failures=len(live.failures), settings=args.set)
        bootstrap_profile(run, spark, running.query, started, started + bootstrap_s)

        with PeakMemory() as memory:
            report = reconcile(spark, config, ["mailbox"])
        steady = next(row for row in report if row.table == "messages")
        run.record("steady-state reconcile, messages", steady.duration_s, "s", rows=steady.scanned,
                   known=steady.known, fed=steady.unknown_fed + steady.overdue_fed, target="fed 0")
        record_memory(run, "steady-state reconcile", memory, args.messages)
    finally:
        running.stop()


if __name__ == "__main__":
    main()
