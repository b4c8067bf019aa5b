"""The purger always on: a steady workload for hours, sampled every few minutes, then the end state checked.

    python -m bench.soak --hours 2

The platform writes the default mailbox workload at ``--rate`` messages per
second (rows, blobs in two data centres, shared and inline payloads, late and
duplicated events), one object to purge and one to keep of each other policy
every ``--objects-every`` seconds, and ``--bad-share`` of bad records (each
kind the dead-letter path handles). The purger runs as ``purger run`` does,
with the daily report refreshing at its default interval and a reconcile every
``--reconcile-every`` (scan, anti-join with the state, feed) in a keyspace of
the run's own. Every ``--sample`` it records, per process (the driver's JVM,
each Python worker): resident memory, open file descriptors and sockets; the
JVM's own account of its memory (native memory tracking: heap and the rest it
knows, so that resident memory beyond it is the native libraries', RocksDB's
among them), and glibc's malloc arenas beside the JVM's own allocations
through them (the rest is the libraries' and what glibc keeps after a free);
the state rows, the checkpoint's size on disk, the batch duration
p50/p99 and the purge lag p99 of the deletions in that window.

Once the platform stops, the run waits for every due object to be decided,
then checks the end state: every due object gone, nothing live deleted, one
ledger record per deletion. The growth of each measure per hour after the
first ``--warm`` is fitted and recorded; the samples go to the run's directory
and ``bench/soak.png``.

``--month`` is a month of running compressed into hours: the retention
periods are seconds (as in every soak) and ``stream.forget_after`` is
``--forget-after`` (10 minutes for 30 days), so the state holds every object's
whole life within the first half hour and is dropped as it would be. Each
sample also records the driver's heap after its last collection and its
threads, the ledger's data files, bytes and log, the daily report's refresh
seconds and the journal's rows; the run passes where every one of
``MONTH_GAUGES`` has a slope over the second half under 2% of its mean an
hour, and what grows by design until a retention longer than the run
(``UNTIL_RETENTION``: the ledger, its files and log, the journal) grows at
one rate (``python -m bench.soak --month --hours 2 --sample 120 --warm 900``).

``--malloc-arena-max N`` runs the driver's JVM with ``MALLOC_ARENA_MAX=N``;
``--jemalloc`` runs it on jemalloc instead of glibc's malloc, with jemalloc's
heap profiler sampling its allocations (dumps in the run's directory, to read
with ``jeprof``; the samples' figures for glibc's arenas then do not apply);
``--state-memory-mb`` sets RocksDB's pool (``stream.state_memory_mb``), whose
use each sample records as RocksDB reports it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pyspark.sql import functions as F

from bench.common import BenchRun, epoch_s, job_kind, spark_jobs
from purger.connectors import cassandra_session
from purger.core.settings import StreamConfig, parse_duration
from purger.running import start_purger
from purger.sinks.ledger import Ledger
from simulation.mailbox import Platform
from purger.policies.rule_events import COMPLETE
from simulation.policy_objects import SETTINGS, PolicyObject, PolicyObjects
from simulation.workload import Workload, is_purged, play_all

PLOT = Path(__file__).parent / "soak.png"

# Each kind of record the stream dead-letters: not JSON, not an object, an unknown type, a field missing.
BAD_RECORDS = (b"{\"event_id\": \"e1\", \"type\": \"enq", b"[1, 2, 3]",
               b"{\"event_id\": \"e2\", \"type\": \"no_such_type\", \"event_time\": \"2026-01-01T00:00:00Z\"}",
               b"{\"event_id\": \"e3\", \"type\": \"enqueue\", \"event_time\": \"2026-01-01T00:00:00Z\"}")


@dataclass
class Sample:
    at_s: float  # seconds into the run
    driver_rss_mb: float
    driver_nmt_committed_mb: float  # what the JVM accounts for (heap, metaspace, threads, code, GC, ...)
    driver_heap_committed_mb: float
    driver_heap_resident_mb: float  # of the committed heap, the pages touched: beside it, what "beyond" leaves out
    driver_arenas_mb: float  # glibc's malloc arenas, resident: the JVM's own allocations and the libraries'
    driver_jvm_malloc_mb: float  # the JVM's own allocations through malloc, as it accounts for them
    driver_fds: int
    driver_sockets: int
    workers: int
    worker_rss_mb_max: float
    worker_rss_mb_total: float
    worker_fds_max: int
    worker_sockets_max: int
    state_rows: int
    state_memory_mb: float  # RocksDB's own report of its memory for the state (memtables, caches, readers)
    checkpoint_mb: float
    batch_p50_s: float
    batch_p99_s: float
    lag_p99_s: float
    deletions: int
    worker_rss_mb: dict[str, float] = field(default_factory=dict)  # pid -> MiB
    # The JVM's account by its own categories (Class, Thread, Code, GC, Compiler, Internal, Symbol, ...), MiB.
    driver_nmt_mb: dict[str, float] = field(default_factory=dict)
    # Sampled since --month (0 in the samples of runs before it).
    driver_heap_after_gc_mb: float = 0.0  # the heap's pools as the last collection of each left them
    driver_threads: int = 0
    ledger_files: int = 0  # the records' data files (Parquet) on disk: every version VACUUM has not removed
    ledger_live_files: int = 0  # of which the table's latest version reads
    ledger_mb: float = 0.0
    ledger_log_mb: float = 0.0  # the Delta log: commits, checkpoints, the change feed's files
    report_refresh_s: float = 0.0  # the daily report's jobs in the window, per refresh interval
    journal_rows: int = 0

    @property
    def driver_outside_nmt_mb(self) -> float:
        """Resident memory the JVM does not account for: native libraries' own allocations (RocksDB's)."""
        return self.driver_rss_mb - self.driver_nmt_committed_mb

    @property
    def driver_libraries_malloc_mb(self) -> float:
        """Of glibc's arenas, what the JVM does not account for: the native libraries' allocations (RocksDB's,
        the compression codecs') and the memory glibc keeps after a free."""
        return self.driver_arenas_mb - self.driver_jvm_malloc_mb


GROWTH = ("driver_rss_mb", "driver_nmt_committed_mb", "driver_outside_nmt_mb", "driver_arenas_mb",
          "driver_jvm_malloc_mb", "driver_libraries_malloc_mb", "driver_fds", "driver_sockets",
          "worker_rss_mb_max", "worker_rss_mb_total", "worker_fds_max", "worker_sockets_max", "state_rows",
          "state_memory_mb", "checkpoint_mb", "batch_p99_s", "lag_p99_s")
# Every gauge the month's pass reads: each one's slope over the run's second half under 2% of its mean an hour.
MONTH_GAUGES = ("driver_rss_mb", "driver_heap_after_gc_mb", "driver_nmt_committed_mb", "driver_outside_nmt_mb",
                "driver_threads", "driver_fds", "worker_rss_mb_max", "worker_rss_mb_total", "worker_fds_max",
                "state_rows", "state_memory_mb", "checkpoint_mb", "ledger_live_files", "report_refresh_s",
                "batch_p50_s", "batch_p99_s", "lag_p99_s")
MONTH_SLOPE = 0.02  # of the gauge's mean, an hour
# What grows by design until a retention no run of hours reaches, each held instead to growing at one rate (its
# slope over the second half within ``STEADY_GROWTH`` of the first half's): the ledger's records (ledger.retention,
# 400 days), the files on disk VACUUM keeps (7 days), its log (delta.logRetentionDuration, 30 days), the
# journal's rows (a 30-day TTL).
UNTIL_RETENTION = ("ledger_mb", "ledger_files", "ledger_log_mb", "journal_rows")
STEADY_GROWTH = 0.25
# From jemalloc's heap profile (``ProfiledMalloc``).
PROFILED = ("rocksdb_mb", "rocksdb_statistics_mb", "jvm_mb", "other_mb")


def descendants(root: int) -> dict[int, str]:
    """Every process below ``root``, but a reconcile's copy of the state and its JVM (``purger.reconcile.known_objects``,
    seconds long, sampled by chance): pid -> command name."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            copying = b"purger.reconcile.known_objects" in (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        name, rest = text.split("(", 1)[1].rsplit(")", 1)
        pid = int(stat.parent.name)
        names[pid] = "copy" if copying else name
        children.setdefault(int(rest.split()[1]), []).append(pid)
    found, stack = {}, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if names.get(pid) == "copy":
            continue
        found[pid] = names.get(pid, "?")
        stack.extend(children.get(pid, []))
    return found


def threads_of(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(l.split()[1]) for l in status.splitlines() if l.startswith("Threads:")), 0)


def heap_after_gc_mb(spark: Any) -> float:
    """The driver's heap as the last collection of each of its pools left it (``MemoryPoolMXBean``), MiB: what
    the heap holds, without what is garbage yet uncollected."""
    management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    used = 0
    for pool in management.getMemoryPoolMXBeans():
        after = pool.getCollectionUsage()
        if pool.getType().toString() == "Heap memory" and after is not None:
            used += after.getUsed()
    return used / 2**20


def ledger_on_disk(records_path: str) -> tuple[int, float, float]:
    """The ledger's data files, their MiB, and its log's MiB (``_delta_log``)."""
    files, data_bytes, log_bytes = 0, 0, 0
    for root, _, names in os.walk(records_path):
        in_log = "_delta_log" in Path(root).parts
        for name in names:
            try:
                size = os.path.getsize(os.path.join(root, name))
            except OSError:
                continue
            if in_log:
                log_bytes += size
            elif name.endswith(".parquet"):
                files, data_bytes = files + 1, data_bytes + size
    return files, data_bytes / 2**20, log_bytes / 2**20


def process_use(pid: int) -> tuple[float, int, int]:
    """Resident MiB, open file descriptors, and how many of them are sockets."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next((int(l.split()[1]) for l in status.splitlines() if l.startswith("VmRSS:")), 0) / 1024
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0.0, 0, 0
    sockets = 0
    for fd in fds:
        try:
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return rss, len(fds), sockets


@dataclass
class NativeMemory:
    """The JVM's own account of its memory beside what its process holds resident, in MiB."""

    committed: float  # all the JVM accounts for (``jcmd VM.native_memory summary``)
    heap_committed: float
    jvm_malloc: float  # the JVM's own allocations through glibc's malloc, among the above
    heap_resident: float  # of the committed heap, the pages touched
    arenas_resident: float  # glibc's malloc arenas: the JVM's allocations and the native libraries'
    by_category: dict[str, float]  # committed, by the account's own categories


# Debian's libjemalloc2 (its jeprof is in libjemalloc-dev), and the binary whose symbols jeprof reads.
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
JAVA = shutil.which("java") or "java"
# glibc's arenas other than the main one are mapped at multiples of their 64 MiB size.
ARENA_BYTES = 64 << 20


def native_memory(pid: int) -> NativeMemory:
    """The JVM's account (native memory tracking) and the process's mappings (``/proc/PID/smaps``)."""
    def jcmd(*command: str) -> str:
        return subprocess.run(["jcmd", str(pid), *command], capture_output=True, text=True, timeout=60).stdout

    summary = jcmd("VM.native_memory", "summary")
    total = re.search(r"Total:.*?committed=(\d+)KB", summary)
    by_category = {name: round(int(kb) / 1024, 1) for name, kb in re.findall(
        r"^-\s+(\S.*?) \(reserved=\d+KB, committed=(\d+)KB\)", summary, re.MULTILINE)}
    heap = re.search(r"\[(0x[0-9a-f]+), (0x[0-9a-f]+)\)", jcmd("GC.heap_info"))
    heap_start, heap_end = (int(heap.group(1), 16), int(heap.group(2), 16)) if heap else (0, 0)
    heap_kb = arenas_kb = 0
    start = end = 0
    name = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        mapping = re.match(r"([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)", line)
        if mapping:
            start, end, name = int(mapping.group(1), 16), int(mapping.group(2), 16), mapping.group(3)
        elif line.startswith("Rss:"):
            kb = int(line.split()[1])
            if not name and heap_start <= start < heap_end:
                heap_kb += kb
            elif name == "[heap]" or (not name and start % ARENA_BYTES == 0 and end - start <= ARENA_BYTES):
                arenas_kb += kb
    malloc = re.search(r"malloc: (\d+)KB", summary)
    return NativeMemory(committed=int(total.group(1)) / 1024 if total else 0.0,
                        heap_committed=by_category.get("Java Heap", 0.0),
                        jvm_malloc=int(malloc.group(1)) / 1024 if malloc else 0.0,
                        heap_resident=heap_kb / 1024, arenas_resident=arenas_kb / 1024, by_category=by_category)


@dataclass
class ProfiledMalloc:
    """The driver's live allocations through malloc, from one of jemalloc's heap profile dumps."""
    at_s: float  # seconds into the run
    rocksdb_mb: float  # under RocksDB's frames: its block cache, memtables, table readers, statistics
    rocksdb_statistics_mb: float  # of which its instances' statistics, never freed in Spark 4.1 (SPARK-56523)
    jvm_mb: float  # the JVM's own (``os::malloc``), which its native memory tracking accounts for
    other_mb: float  # the rest: zlib and the other native libraries


def _jeprof_mb(dump: Path, *selection: str) -> float:
    """The live bytes of a heap profile dump, summed over the functions ``selection`` keeps."""
    text = subprocess.run(["jeprof", "--text", "--show_bytes", *selection, JAVA, str(dump)],
                          capture_output=True, text=True, timeout=300).stdout
    return sum(int(line.split()[0]) for line in text.splitlines()[1:] if line.split()) / (1 << 20)


def profiled_malloc(profiles: Path, started: float, every_s: float) -> list[ProfiledMalloc]:
    """The JVM's heap profile dumps (the process with the most dumps), one per ``every_s`` of the run."""
    dumps: dict[str, list[Path]] = {}
    for dump in profiles.glob("heap.*.i*.heap"):
        dumps.setdefault(dump.name.split(".")[1], []).append(dump)
    if not dumps:
        return []
    chosen: list[Path] = []
    for dump in sorted(max(dumps.values(), key=len), key=lambda d: d.stat().st_mtime):
        if not chosen or dump.stat().st_mtime - chosen[-1].stat().st_mtime >= every_s:
            chosen.append(dump)
    profiled = []
    for dump in chosen:
        rocksdb = _jeprof_mb(dump, "--focus=rocksdb")
        statistics = _jeprof_mb(dump, "--focus=rocksdb::StatisticsImpl")
        jvm = _jeprof_mb(dump, "--focus=os::malloc|os::strdup|NMTPreInit", "--ignore=rocksdb")
        rest = _jeprof_mb(dump, "--ignore=rocksdb|os::malloc|os::strdup|NMTPreInit")
        profiled.append(ProfiledMalloc(at_s=round(dump.stat().st_mtime - started, 1), rocksdb_mb=round(rocksdb, 1),
                                       rocksdb_statistics_mb=round(statistics, 1),
                                       jvm_mb=round(jvm, 1), other_mb=round(rest, 1)))
    return profiled


def directory_mb(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                continue
    return total / 2**20


class Sampler:
    """Every ``every_s``, one ``Sample`` of the purger's processes, state, checkpoint, batches and lag."""

    def __init__(self, run: BenchRun, spark: Any, running: Any, ledger: Ledger, started: float, every_s: float) -> None:
        self.run, self.spark, self.running, self.ledger = run, spark, running, ledger
        self.started, self.every_s = started, every_s
        cassandra = run.config.cassandra
        self.cassandra = cassandra_session(cassandra, cassandra.keyspace)
        self.journal_count = f"SELECT COUNT(*) FROM {cassandra.keyspace}.{cassandra.journal_table}"
        self.samples: list[Sample] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="soak-sampler", daemon=True)
        self.seen_batches: set[int] = set()

    def start(self) -> "Sampler":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.cassandra.shutdown()

    def _loop(self) -> None:
        window_start = time.time()
        while not self.stopped.wait(self.every_s):
            window_end = time.time()
            try:
                self.samples.append(self.sample(window_start, window_end))
                print(f"soak sample: {json.dumps(asdict(self.samples[-1]))}", flush=True)
            except Exception as error:  # one sample lost is not the run lost
                print(f"soak sample failed: {error!r}", flush=True)
            window_start = window_end

    def sample(self, window_start: float, window_end: float) -> Sample:
        processes = descendants(os.getpid())
        jvm = max((pid for pid, name in processes.items() if name == "java"), key=lambda pid: process_use(pid)[0])
        driver_rss, driver_fds, driver_sockets = process_use(jvm)
        jvm_memory = native_memory(jvm)
        workers = {pid: process_use(pid) for pid, name in processes.items() if name.startswith("python")}
        progress = [json.loads(p.json) for p in self.running.query.recentProgress]
        in_window = [p for p in progress if window_start <= epoch_s(p["timestamp"]) < window_end]
        durations = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in in_window] or [0.0]
        operators = progress[-1]["stateOperators"] if progress else []
        state_rows = sum(op.get("numRowsTotal", 0) for op in operators)
        state_memory = sum(op.get("memoryUsedBytes", 0) for op in operators) / 2**20
        # Messages' and payloads': a unit of work is due years after it started, by its rule.
        lags = [r["lag_s"] for r in self.ledger.records()
                .where((F.col("status") == "purged") & F.col("dc").isNull() & F.col("kind").isin("message", "payload")
                       & (F.col("deleted_at").cast("double") >= window_start)
                       & (F.col("deleted_at").cast("double") < window_end)).select("lag_s").collect()]
        ledger_files, ledger_mb, ledger_log_mb = ledger_on_disk(self.run.config.ledger.path)
        ledger_live = self.spark.sql(f"DESCRIBE DETAIL delta.`{self.run.config.ledger.path}`").first()["numFiles"]
        refreshes = max(1.0, (window_end - window_start) / self.run.config.ledger.report_interval.total_seconds())
        report_s = sum((job["end_ms"] - job["start_ms"]) / 1000 for job in spark_jobs(self.spark, window_start * 1000)
                       if job_kind(job["description"]) == "daily report" and job["end_ms"] < window_end * 1000)
        journal_rows = self.cassandra.execute(self.journal_count, timeout=120).one()[0]
        return Sample(
            at_s=round(window_end - self.started, 1), driver_rss_mb=round(driver_rss, 1),
            driver_nmt_committed_mb=round(jvm_memory.committed, 1),
            driver_heap_committed_mb=round(jvm_memory.heap_committed, 1),
            driver_heap_resident_mb=round(jvm_memory.heap_resident, 1),
            driver_arenas_mb=round(jvm_memory.arenas_resident, 1),
            driver_jvm_malloc_mb=round(jvm_memory.jvm_malloc, 1),
            driver_fds=driver_fds, driver_sockets=driver_sockets, workers=len(workers),
            worker_rss_mb_max=round(max((w[0] for w in workers.values()), default=0), 1),
            worker_rss_mb_total=round(sum(w[0] for w in workers.values()), 1),
            worker_fds_max=max((w[1] for w in workers.values()), default=0),
            worker_sockets_max=max((w[2] for w in workers.values()), default=0),
            state_rows=state_rows, state_memory_mb=round(state_memory, 1),
            checkpoint_mb=round(directory_mb(self.run.config.stream.checkpoint_location), 1),
            batch_p50_s=round(float(np.percentile(durations, 50)), 2),
            batch_p99_s=round(float(np.percentile(durations, 99)), 2),
            lag_p99_s=round(float(np.percentile(lags, 99)), 2) if lags else 0.0, deletions=len(lags),
            worker_rss_mb={str(pid): round(w[0], 1) for pid, w in workers.items()},
            driver_nmt_mb=jvm_memory.by_category,
            driver_heap_after_gc_mb=round(heap_after_gc_mb(self.spark), 1), driver_threads=threads_of(jvm),
            ledger_files=ledger_files, ledger_live_files=ledger_live, ledger_mb=round(ledger_mb, 1),
            ledger_log_mb=round(ledger_log_mb, 1),
            report_refresh_s=round(report_s / refreshes, 2), journal_rows=journal_rows,
        )


class SoakPlatform:
    """The platform's writers: the mailbox workload, the other policies' objects, bad records.

    With ``life_s`` (``--month``) nothing stays live for ever: ``life_s`` after it was written, each message the
    workload leaves live is deleted by its user, each kept rule event completes and each kept user leaves its
    last data centre, so that each becomes due; ``ended`` says when. (No unit of work is kept: the
    policy's retention is counted in days, longer than any run.)"""

    def __init__(self, run: BenchRun, rate: float, seconds: float, objects_every_s: float, bad_share: float,
                 life_s: float | None = None) -> None:
        self.run, self.rate, self.seconds = run, rate, seconds
        self.objects_every_s, self.bad_share, self.life_s = objects_every_s, bad_share, life_s
        self.mailbox = Platform(run.config)
        self.objects = PolicyObjects(run.config)
        self.plans: dict[str, tuple[str, str]] = {}  # message -> (payload, scenario)
        self.written: list[PolicyObject] = []
        self.ended: dict[tuple[str, str], float] = {}  # (kind, id) -> when the platform ended a live object
        self.bad = 0
        self._lock = threading.Lock()
        self._ends: list[tuple[float, int, tuple[str, str], Callable[[], Any]]] = []  # a heap, by when
        self._ends_added = threading.Condition(self._lock)

    def play(self) -> None:
        done = threading.Event()
        others = threading.Thread(target=self._others, args=(done,), name="soak-objects", daemon=True)
        ender = threading.Thread(target=self._end_lives, args=(done,), name="soak-ends", daemon=True)
        others.start()
        ender.start()
        try:
            messages = int(self.rate * self.seconds)
            play_all(self.mailbox, Workload(late_share=0.05, duplicate_share=0.05).plans(self.run.run, messages),
                     rate=self.rate, on_played=self._played)
        finally:
            done.set()
            others.join()
            with self._lock:
                self._ends_added.notify()
            ender.join()
            self.mailbox.flush()
            self.objects.flush()

    def _played(self, plan: Any, payload: str) -> None:
        every = round(1 / self.bad_share) if self.bad_share else 0
        with self._lock:
            self.plans[plan.message] = (payload, plan.scenario)
            if every and len(self.plans) % every == 0:
                self.mailbox.send([(plan.message.encode(), BAD_RECORDS[self.bad % len(BAD_RECORDS)])])
                self.bad += 1
        if not is_purged(plan.scenario):
            self._end_later(("message", plan.message), partial(self.mailbox.delete, plan.message))

    def _others(self, done: threading.Event) -> None:
        batch = 0
        while not done.wait(self.objects_every_s):
            written = self.objects.write(f"{self.run.run}-{batch}", kept_unit=self.life_s is None)
            self.written.extend(written)
            for o in written:
                if not o.eligible and o.kind == "rule_event":
                    self._end_later((o.kind, o.id), partial(self.objects.rule_events.set_status, o.id, COMPLETE))
                elif not o.eligible and o.kind == "user":
                    self._end_later((o.kind, o.id), partial(self.objects.users.remove_user, o.id, "dc2"))
            batch += 1

    def _end_later(self, key: tuple[str, str], end: Callable[[], Any]) -> None:
        if self.life_s is None:
            return
        with self._lock:
            heapq.heappush(self._ends, (time.time() + self.life_s, len(self.ended) + len(self._ends), key, end))
            self._ends_added.notify()

    def _end_lives(self, done: threading.Event) -> None:
        """End each live object at its time, until the play is done and nothing is left to end."""
        while True:
            with self._lock:
                while not self._ends and not done.is_set():
                    self._ends_added.wait()
                if not self._ends:
                    return
                at, _, key, end = self._ends[0]
                if at > time.time():
                    self._ends_added.wait(at - time.time())
                    continue
                heapq.heappop(self._ends)
            ending = time.time()  # before the change: a deletion before it was of a live object
            end()
            with self._lock:
                self.ended[key] = ending

    def close(self) -> None:
        self.mailbox.close()
        self.objects.close()


def end_state(platform: SoakPlatform, ledger: Ledger) -> dict[str, Any]:
    """Due objects left, live ones deleted, deletions missing from the ledger or recorded twice. An object the
    platform ended (``--month``) is due, and was deleted while live if the ledger's deletion is before its end."""
    mailbox, ended = platform.mailbox, platform.ended
    due = [m for m, (_, scenario) in platform.plans.items() if is_purged(scenario) or ("message", m) in ended]
    live = [m for m, (_, scenario) in platform.plans.items() if not is_purged(scenario) and ("message", m) not in ended]
    rows = ledger.records().where(F.col("status") == "purged").select(
        "kind", "id", "dc", F.col("deleted_at").cast("double").alias("deleted_s")).collect()
    records = Counter((r["kind"], r["id"], r["dc"]) for r in rows)
    deleted_s = {(r["kind"], r["id"]): r["deleted_s"] for r in rows if r["dc"] is None}
    objects_due = [o for o in platform.written if o.eligible or (o.kind, o.id) in ended]
    return {
        "due_messages": len(due), "live_messages": len(live), "other_objects": len(platform.written),
        "ended_by_the_platform": len(ended),
        "due_left": sum(mailbox.row(m) is not None for m in due)
        + sum(not platform.objects.gone(o) for o in objects_due),
        "live_deleted": sum(mailbox.row(m) is None for m in live)
        + sum(not platform.objects.intact(o) for o in platform.written if o not in objects_due)
        + sum(deleted_s.get(key, at) < at for key, at in ended.items()),
        "ledger_missing": sum(("message", m, None) not in records for m in due)
        + sum((o.kind, o.id, None) not in records for o in objects_due),
        "ledger_doubled": sum(n > 1 for n in records.values()),
        "bad_records": platform.bad,
    }


def growth_per_hour(late: list[Any], names: tuple[str, ...],
                    value: Callable[[Any, str], float] = getattr) -> dict[str, float]:
    """Each measure's least-squares slope per hour over ``late`` (samples or profile readings)."""
    if len(late) < 3:
        return {}
    hours = np.array([s.at_s for s in late]) / 3600
    return {name: round(float(np.polyfit(hours, np.array([value(s, name) for s in late], dtype=float), 1)[0]), 2)
            for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=2)
    parser.add_argument("--rate", type=float, default=10, help="messages per second")
    parser.add_argument("--objects-every", type=float, default=5, help="seconds between the other policies' objects")
    parser.add_argument("--bad-share", type=float, default=0.01, help="bad records per message")
    parser.add_argument("--sample", type=float, default=300, help="seconds between samples")
    parser.add_argument("--warm", type=float, default=900, help="seconds before growth is fitted")
    parser.add_argument("--reconcile-every", default="30m")
    parser.add_argument("--malloc-arena-max", type=int)
    parser.add_argument("--jemalloc", action="store_true", help="the driver's JVM on jemalloc, its heap profiled")
    parser.add_argument("--state-memory-mb", type=int, help="RocksDB's pool (stream.state_memory_mb)")
    parser.add_argument("--month", action="store_true",
                        help="every period in minutes, state that never fires forgotten (--forget-after): each "
                             "gauge's slope over the second half held under 2%% of its mean an hour")
    parser.add_argument("--forget-after", default="10m", help="stream.forget_after with --month")
    parser.add_argument("--life", default="5m", help="with --month, how long an object the workload keeps lives")
    parser.add_argument("--plot-from", type=Path, metavar="RUN_DIR",
                        help="no run: plot a finished run's samples (and read its heap profile) again")
    args = parser.parse_args()
    if args.plot_from:
        samples = [Sample(**json.loads(line)) for line in (args.plot_from / "samples.jsonl").read_text().splitlines()]
        started = float((args.plot_from / "started").read_text())
        pool_mb = args.state_memory_mb or StreamConfig.model_fields["state_memory_mb"].default
        conclude(args, samples, started, args.plot_from, pool_mb)
        return
    # The driver's JVM, started below, accounts for its own memory; and glibc's arenas as asked.
    os.environ["JDK_JAVA_OPTIONS"] = "-XX:NativeMemoryTracking=summary"
    if args.malloc_arena_max:
        os.environ["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
    tag = uuid.uuid4().hex[:6]
    run = BenchRun.start(
        "soak", cassandra={"keyspace": f"bench_soak_{tag}"},
        stream={**({"state_memory_mb": args.state_memory_mb} if args.state_memory_mb else {}),
                **({"forget_after": args.forget_after} if args.month else {})},
        reconcile={"interval": args.reconcile_every},
        policies={"mailbox": {"expired_ttl": "20s", "incomplete_ttl": "20s", "deleted_ttl": "0s",
                              "payload_grace": "5s"}, **SETTINGS,
                  # The kept rule event (PROCESSING) stays kept for the whole run, as the end state expects.
                  "rule_events": {**SETTINGS["rule_events"], "processing": f"{round(args.hours * 3600) + 3600}s"}})
    config = run.config
    if args.jemalloc:
        # Only the driver's JVM and the processes it starts run on jemalloc: not the servers started
        # above, nor the jcmd calls that sample it. A dump each 4 GiB allocated: the JVM makes one every few
        # seconds, the short-lived processes none.
        profiles = run.work / "jemalloc"
        profiles.mkdir()
        os.environ["LD_PRELOAD"] = JEMALLOC
        os.environ["MALLOC_CONF"] = f"prof:true,lg_prof_interval:32,prof_prefix:{profiles}/heap"
    spark = run.spark()
    for name in ("LD_PRELOAD", "MALLOC_CONF"):
        os.environ.pop(name, None)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")
    running = start_purger(spark, config)
    ledger = Ledger(spark, config.ledger)
    started = time.time()
    (run.work / "started").write_text(str(started))
    sampler = Sampler(run, spark, running, ledger, started, args.sample).start()
    life_s = parse_duration(args.life).total_seconds() if args.month else None
    platform = SoakPlatform(run, args.rate, args.hours * 3600, args.objects_every, args.bad_share, life_s)
    try:
        platform.play()
        played_s = time.time() - started
        print(f"platform stopped after {played_s:.0f} s: {len(platform.plans)} messages, "
              f"{len(platform.written)} other objects, {platform.bad} bad records", flush=True)
        deadline = time.monotonic() + 900  # the ends of --month's last lives are within the play
        while time.monotonic() < deadline:
            state = end_state(platform, ledger)
            if state["due_left"] == 0:
                break
            time.sleep(30)
        time.sleep(30)  # the last payloads: released, then their grace
    finally:
        sampler.stop()
        running.stop()
    state = end_state(platform, ledger)
    platform.close()
    samples = sampler.samples
    (run.work / "samples.jsonl").write_text("".join(json.dumps(asdict(s)) + "\n" for s in samples))
    print(f"end state: {state}", flush=True)
    settings = {"hours": args.hours, "rate": args.rate, "malloc_arena_max": args.malloc_arena_max,
                "jemalloc": args.jemalloc, "state_memory_mb": config.stream.state_memory_mb,
                **({"month": True, "life": args.life, "forget_after": args.forget_after} if args.month else {})}
    run.record("soak: due objects left, live ones deleted, ledger records missing or doubled",
               state["due_left"] + state["live_deleted"] + state["ledger_missing"] + state["ledger_doubled"],
               "objects", target="0", end_state=state, **settings)
    for name, (slope, first) in conclude(args, samples, started, run.work, config.stream.state_memory_mb).items():
        run.record(f"soak: {name} growth per hour after {args.warm:.0f} s", slope, "per hour",
                   baseline=(f"{name} at {args.warm:.0f} s", first), **settings)
    if args.month:
        # The platform's second half of writing (not the drain after it, when nothing new comes).
        second_half = [s for s in samples if args.hours * 3600 / 2 <= s.at_s <= args.hours * 3600]
        verdicts = month_verdicts(second_half)
        for name, (slope, mean) in verdicts.items():
            run.record(f"month: {name}, slope over the second half", slope, "per hour",
                       baseline=(f"{name}, mean over the second half", mean), target=f"< {MONTH_SLOPE:.0%} of the mean",
                       **settings)
        failed = [name for name, (slope, mean) in verdicts.items() if not holds_level(slope, mean)]
        print(f"month: {len(verdicts) - len(failed)} of {len(verdicts)} gauges level over the second half"
              + (f"; growing: {', '.join(failed)}" if failed else ""), flush=True)
        first_half = [s for s in samples if args.warm <= s.at_s < args.hours * 3600 / 2]
        early, late = growth_per_hour(first_half, UNTIL_RETENTION), growth_per_hour(second_half, UNTIL_RETENTION)
        for name in UNTIL_RETENTION:
            if name in early and name in late:
                run.record(f"month: {name}, slope over the second half (grows until its retention)", late[name],
                           "per hour", baseline=("the first half's", early[name]),
                           target=f"within {STEADY_GROWTH:.0%} of the first half's", **settings)


def holds_level(slope: float, mean: float) -> bool:
    """A gauge's slope an hour under ``MONTH_SLOPE`` of its mean (a gauge at 0 throughout holds)."""
    return abs(slope) <= MONTH_SLOPE * abs(mean) if mean else slope == 0


def month_verdicts(samples: list[Sample]) -> dict[str, tuple[float, float]]:
    """Each of ``MONTH_GAUGES``: its least-squares slope an hour over ``samples`` and its mean."""
    slopes = growth_per_hour(samples, MONTH_GAUGES)
    return {name: (slope, round(float(np.mean([getattr(s, name) for s in samples])), 2))
            for name, slope in slopes.items()}


def conclude(args: argparse.Namespace, samples: list[Sample], started: float, work: Path, pool_mb: int,
             ) -> dict[str, tuple[float, float]]:
    """Each measure's growth per hour after the warm-up and its value then; the heap profile read, if the
    run made one; the plot."""
    profile = profiled_malloc(work / "jemalloc", started, args.sample) if args.jemalloc else []
    if profile:
        (work / "profile.jsonl").write_text("".join(json.dumps(asdict(p)) + "\n" for p in profile))
    growth = {}
    # Under jemalloc glibc's arenas hold nothing: its profile says what the native libraries hold.
    arenas = ("driver_arenas_mb", "driver_libraries_malloc_mb")
    measures = tuple(name for name in GROWTH if name not in arenas) if args.jemalloc else GROWTH
    for series, names in ((samples, measures), (profile, PROFILED)):
        late = [s for s in series if s.at_s >= args.warm]
        for name, slope in growth_per_hour(late, names).items():
            growth[name] = (slope, float(getattr(late[0], name)))
    print(f"growth per hour after {args.warm:.0f} s: { {name: slope for name, (slope, _) in growth.items()} }",
          flush=True)
    late = [s for s in samples if s.at_s >= args.warm and s.driver_nmt_mb]
    if late:
        by_category = growth_per_hour(late, tuple(late[-1].driver_nmt_mb), lambda s, name: s.driver_nmt_mb.get(name, 0))
        print(f"the JVM's account by category, growth per hour after {args.warm:.0f} s: {by_category}", flush=True)
    allocator = "jemalloc" if args.jemalloc else (f"MALLOC_ARENA_MAX={args.malloc_arena_max}"
                                                  if args.malloc_arena_max else "")
    plot(samples, profile, args.warm, args.hours, allocator, pool_mb)
    return growth


def plot(samples: list[Sample], profile: list[ProfiledMalloc], warm_s: float, hours: float, allocator: str,
         pool_mb: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = np.array([s.at_s for s in samples]) / 60

    def series(name: str) -> np.ndarray:
        return np.array([getattr(s, name) for s in samples], dtype=float)

    figure, axes = plt.subplots(7, 1, sharex=True, figsize=(9, 17.5))
    memory, native, descriptors, state, ledger, batches, lag = axes
    for name, label in (("driver_rss_mb", "driver JVM, resident"), ("driver_nmt_committed_mb", "driver JVM, its own account"),
                        ("driver_heap_after_gc_mb", "driver JVM, heap after the last collection"),
                        ("worker_rss_mb_total", "Python workers, resident, together")):
        memory.plot(minutes, series(name), label=label)
    memory.set_ylabel("MiB")
    native.plot(minutes, series("driver_outside_nmt_mb"), label="driver JVM, resident beyond its own account")
    native.plot(minutes, series("state_memory_mb"), label=f"RocksDB, its own report (pool of {pool_mb} MB)")
    if profile:
        at = np.array([p.at_s for p in profile]) / 60
        native.plot(at, [p.rocksdb_mb for p in profile], label="RocksDB's live allocations (jemalloc's profile)")
        native.plot(at, [p.rocksdb_statistics_mb for p in profile],
                    label="  of which its instances' statistics (SPARK-56523)")
        native.plot(at, [p.other_mb for p in profile], label="other native libraries' (jemalloc's profile)")
    else:
        native.plot(minutes, series("driver_arenas_mb"), label="glibc's malloc arenas, resident")
        native.plot(minutes, series("driver_libraries_malloc_mb"), label="  of which not the JVM's own")
    native.set_ylabel("MiB")
    memory.set_title(f"Purger soak, {hours:g} h" + (f", {allocator}" if allocator else "")
                     + ": sampled every few minutes")
    for name, label in (("driver_fds", "driver JVM, open files"), ("driver_sockets", "driver JVM, sockets"),
                        ("worker_fds_max", "a Python worker, open files (max)"),
                        ("worker_sockets_max", "a Python worker, sockets (max)"),
                        ("driver_threads", "driver JVM, threads")):
        descriptors.plot(minutes, series(name), label=label)
    descriptors.set_ylabel("descriptors")

    def two_scales(axis: Any, left: tuple[tuple[str, str], ...], left_unit: str, right: tuple[str, str],
                   right_unit: str) -> None:
        for name, label in left:
            axis.plot(minutes, series(name), label=label)
        axis.set_ylabel(left_unit)
        other = axis.twinx()
        other.plot(minutes, series(right[0]), color="tab:red", label=right[1])
        other.set_ylabel(right_unit)

    two_scales(state, (("state_rows", "state rows"),), "rows", ("checkpoint_mb", "checkpoint on disk (MiB)"), "MiB")
    two_scales(ledger, (("ledger_files", "ledger data files on disk"), ("ledger_live_files", "ledger data files read"),
                        ("ledger_mb", "ledger data (MiB)"),
                        ("ledger_log_mb", "ledger log (MiB)")), "files, MiB", ("journal_rows", "journal rows"), "rows")
    batches.plot(minutes, series("report_refresh_s"), label="daily report refresh")
    batches.plot(minutes, series("batch_p50_s"), label="batch duration p50")
    batches.plot(minutes, series("batch_p99_s"), label="batch duration p99")
    batches.set_ylabel("seconds")
    lag.plot(minutes, series("lag_p99_s"), label="purge lag p99 (messages and payloads)")
    lag.set_ylabel("seconds")
    lag.set_xlabel("minutes into the run")
    for axis in axes:
        axis.axvline(warm_s / 60, linestyle=":", color="grey")
        axis.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    figure.savefig(PLOT, dpi=100)
    print(f"plot: {PLOT}")


if __name__ == "__main__":
    main()
