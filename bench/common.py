"""What the benchmarks share: a run's configuration and servers, timed streaming runs, memory, and results.

Every figure is printed and appended as one JSON line to ``bench/results.jsonl``
with its baseline (measured in the same run), the ratio, the command and the
machine, so ``BENCHMARKS.md`` can be written from it.

Example::

    run = BenchRun.start("stateful", policies={"mailbox": {"expired_ttl": "10s"}})
    run.record("stateful stage", 12_000, "events/s", baseline=("native aggregation", 20_000), target=0.8)
"""

from __future__ import annotations

import json
import os
import platform as host
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from kafka import KafkaConsumer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from purger.core.settings import PurgerConfig

from purger.config import build_config
from purger.connectors import NotDelivered, kafka_client, kafka_producer
from devstack.stack import LocalStack
from purger.streams.clock import tick

RESULTS = Path(__file__).parent / "results.jsonl"


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), host.processor())
    memory_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemTotal")))
    return f"{os.cpu_count()} cores ({model}), {memory_kb / 2**20:.0f} GiB, local[2]"


@dataclass
class BenchRun:
    name: str
    run: str
    config: PurgerConfig
    work: Path

    @classmethod
    def start(cls, name: str, **sections: dict[str, Any]) -> "BenchRun":
        """A configuration of its own (topics, checkpoint, ledger), the local stack up, its topics made."""
        run = f"{name}-{uuid.uuid4().hex[:6]}"
        work = Path(tempfile.mkdtemp(prefix=f"purger-bench-{run}-"))
        raw: dict[str, Any] = {
            "kafka": {"topics": [f"bench.{run}.events"], "control_topic": f"bench.{run}.control",
                      "dead_letter_topic": f"bench.{run}.dead-letter", "reconcile_topic": f"bench.{run}.reconcile"},
            "stream": {"query_name": f"bench-{run}", "checkpoint": str(work / "checkpoint")},
            "ledger": {"path": str(work / "ledger" / "records"), "report_path": str(work / "ledger" / "report"),
                       "reconcile_path": str(work / "ledger" / "reconcile")},
            "metrics": {"port": 0},
            "reconcile": {"interval": "0"},  # a benchmark reconciles when it measures reconciling
        }
        for section, values in sections.items():
            raw.setdefault(section, {}).update(values)
        config = build_config(raw)
        LocalStack(log=lambda line: print(f"stack: {line}")).up(config)
        return cls(name, run, config, work)

    def spark(self) -> SparkSession:
        from purger.spark import spark_session

        spark = spark_session(self.config.stream, app_name=f"bench-{self.name}")
        spark.sparkContext.setLogLevel("ERROR")
        # Every batch's progress, for the figures and the plot (Spark keeps the last 100 by default).
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
        return spark

    def record(self, figure: str, value: float, unit: str, baseline: tuple[str, float] | None = None,
               target: str | None = None, **details: Any) -> None:
        """Print a figure (with its baseline and ratio) and append it to the results file."""
        entry: dict[str, Any] = {
            "bench": self.name, "figure": figure, "value": round(value, 3), "unit": unit,
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
            "command": shlex.join(["python", "-m", f"bench.{self.name}", *sys.argv[1:]]), "commit": _commit(),
            **details,
        }
        line = f"{figure}: {value:,.1f} {unit}"
        if baseline is not None:
            entry["baseline"], entry["baseline_value"] = baseline[0], round(baseline[1], 3)
            entry["ratio"] = round(value / baseline[1], 3) if baseline[1] else None
            line += f"   baseline {baseline[0]}: {baseline[1]:,.1f} {unit}, ratio {entry['ratio']}"
        if target is not None:
            entry["target"] = target
            line += f"   (target {target})"
        print(line, flush=True)
        with RESULTS.open("a") as results:
            results.write(json.dumps(entry) + "\n")


def _commit() -> str:
    """The code measured: the checked-out commit, marked when the tree has changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True).stdout.strip()

    # Paths from the repository's top: the documents and the results are not code measured.
    edited = git("status", "--porcelain", "--", ":(top)", ":(top,exclude)bench/results.jsonl", ":(top,exclude)*.png",
                 ":(top,exclude)*.md")
    return git("rev-parse", "--short", "HEAD") + ("+changes" if edited else "")


def overrides(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """``section.key=value`` pairs (a benchmark's ``--set``) as configuration sections; ``section.key.name=value``
    sets one entry of a table such as ``kafka.properties``.

    >>> overrides(["stream.watermark_delay=2s", "kafka.properties.fetch.max.wait.ms=50"])
    {'stream': {'watermark_delay': '2s'}, 'kafka': {'properties': {'fetch.max.wait.ms': '50'}}}
    """
    sections: dict[str, dict[str, Any]] = defaultdict(dict)
    for pair in pairs:
        name, _, value = pair.partition("=")
        section, _, key = name.partition(".")
        if not (section and key and value):
            raise SystemExit(f"--set {pair}: expected section.key=value, e.g. stream.watermark_delay=2s")
        key, _, entry = key.partition(".")
        if entry:
            sections[section].setdefault(key, {})[entry] = value
        else:
            sections[section][key] = value
    return dict(sections)


def topic_end_offsets(config: PurgerConfig, topics: list[str] | None = None) -> dict[tuple[str, int], int]:
    consumer = kafka_client(KafkaConsumer, config.kafka)
    try:
        partitions = [TopicPartition(t, p) for t in topics or config.kafka.topics
                      for p in sorted(consumer.partitions_for_topic(t) or ())]
        return {(tp.topic, tp.partition): offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def read_all_with_kafka_python(config: PurgerConfig) -> tuple[int, float]:
    """Baseline: a plain kafka-python read of the events topics from the earliest offset; (records, seconds)."""
    ends = topic_end_offsets(config)
    total = sum(ends.values())
    consumer = kafka_client(KafkaConsumer, config.kafka, auto_offset_reset="earliest", enable_auto_commit=False,
                            max_poll_records=5000, fetch_max_bytes=64 * 2**20)
    consumer.assign([TopicPartition(t, p) for t, p in ends])
    consumer.seek_to_beginning()
    read = 0
    started = time.perf_counter()
    try:
        while read < total:
            for records in consumer.poll(timeout_ms=1000).values():
                read += len(records)
        return read, time.perf_counter() - started
    finally:
        consumer.close()


@contextmanager
def ticking(config: PurgerConfig, interval_s: float = 1.0) -> Iterator[None]:
    """Clock ticks on the control topic every ``interval_s`` whatever the query's progress (unlike the
    purger's clock, which waits until the query has caught up), so timers fire while a backlog is read."""
    producer = kafka_producer(config.kafka)
    stopped = threading.Event()

    def run() -> None:
        while not stopped.wait(interval_s):
            producer.send(config.kafka.control_topic, tick())
            try:
                producer.flush()
            except NotDelivered as error:  # a tick lost: the next one moves the clock as far
                print(f"bench clock: {error}", flush=True)

    thread = threading.Thread(target=run, name="bench-clock", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join()
        producer.close()


def read_to(query: StreamingQuery, ends: dict[tuple[str, int], int], timeout_s: float = 7200) -> float:
    """Wait until the query's batches have read up to ``ends`` on every events partition; return the
    seconds since the query started, by its progress's own timestamps."""
    deadline = time.monotonic() + timeout_s
    first: dict | None = None
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        if first is None and query.recentProgress:
            first = json.loads(query.recentProgress[0].json)
        last = json.loads(query.lastProgress.json) if query.lastProgress else None
        if first is not None and last is not None and has_read(last, ends):
            return (epoch_s(last["timestamp"]) + last["durationMs"].get("triggerExecution", 0) / 1000
                    - epoch_s(first["timestamp"]))
        time.sleep(0.5)
    raise TimeoutError(f"the query did not read up to {ends} in {timeout_s} s")


def has_read(progress: dict, ends: dict[tuple[str, int], int]) -> bool:
    """Whether the batch of ``progress`` had read up to ``ends`` on every partition."""
    read: dict[tuple[str, int], int] = {}
    for source in progress.get("sources", []):
        for topic, offsets in (source.get("endOffset") or {}).items():
            for partition, offset in offsets.items():
                read[(topic, int(partition))] = offset
    return all(read.get(p, 0) >= end for p, end in ends.items())


def epoch_s(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def process_tree_rss_mb(root_pid: int | None = None) -> dict[str, float]:
    """Resident memory of this process and its descendants (the driver's JVM, Python workers), in MiB,
    summed by command name (java, python)."""
    root = root_pid or os.getpid()
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(status.parent.name))
        except (OSError, IndexError):
            continue
    totals: dict[str, float] = {}
    stack = [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        name = next(l.split()[1] for l in text.splitlines() if l.startswith("Name:"))
        rss = next((int(l.split()[1]) for l in text.splitlines() if l.startswith("VmRSS:")), 0)
        kind = "java" if name == "java" else "python" if name.startswith("python") else name
        totals[kind] = totals.get(kind, 0.0) + rss / 1024
    return totals


def spark_jobs(spark: SparkSession, since_ms: float) -> list[dict[str, Any]]:
    """The application's finished jobs submitted since ``since_ms``, from the Spark UI's REST API: each
    with its ``description`` (the sink's "batch 7: purge candidates", "daily report", or Spark's own)
    and its ``start_ms`` and ``end_ms``."""
    url = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/jobs"
    with urllib.request.urlopen(url) as answer:
        jobs = json.load(answer)
    finished = [{"description": job.get("description") or job.get("name") or "",
                 "start_ms": _epoch_ms(job["submissionTime"]), "end_ms": _epoch_ms(job["completionTime"]),
                 "stage_ids": job.get("stageIds", [])}
                for job in jobs if "completionTime" in job and "submissionTime" in job]
    return [job for job in finished if job["start_ms"] >= since_ms]


def spark_stages(spark: SparkSession) -> dict[int, dict[str, Any]]:
    """The application's completed stages by id, from the Spark UI's REST API: each with its ``name``
    (the call that made it), ``wall_s`` (submission to completion), ``tasks`` and the tasks' summed
    ``run_s`` and ``cpu_s``."""
    url = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/stages"
    with urllib.request.urlopen(f"{url}?status=complete") as answer:
        stages = json.load(answer)
    return {stage["stageId"]: {"name": stage["name"].split(" at ")[0], "tasks": stage["numTasks"],
                               "wall_s": (_epoch_ms(stage["completionTime"]) - _epoch_ms(stage["submissionTime"])) / 1000,
                               "run_s": stage["executorRunTime"] / 1000, "cpu_s": stage["executorCpuTime"] / 1e9}
            for stage in stages if "completionTime" in stage and "submissionTime" in stage}


def stage_profile(jobs: list[dict[str, Any]], stages: dict[int, dict[str, Any]], step: str) -> dict[str, dict[str, float]]:
    """Where a step's jobs spend their time, median per job: each stage (in the job's order, by the call
    that made it) with its wall seconds, its tasks' run and CPU seconds, and "between stages", the job's
    time outside any stage (scheduling and the driver)."""
    per_stage: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for job in jobs:
        if job_kind(job["description"]) != step:
            continue
        ran = [stages[i] for i in sorted(job["stage_ids"]) if i in stages]
        for position, stage in enumerate(ran):
            for measure in ("wall_s", "run_s", "cpu_s", "tasks"):
                per_stage[f"{position + 1}. {stage['name']}"][measure].append(stage[measure])
        per_stage["between stages"]["wall_s"].append(
            (job["end_ms"] - job["start_ms"]) / 1000 - sum(stage["wall_s"] for stage in ran))
    return {name: {measure: statistics.median(values) for measure, values in measures.items()}
            for name, measures in per_stage.items()}


def job_kind(description: str) -> str:
    """What ran a job, by its description: a step of the sink's batches ("batch 7: ledger" is "ledger"),
    the report's refresh ("daily report"), or Spark's and Delta's own ("other")."""
    if description.startswith("batch ") and ": " in description:
        return description.split(": ", 1)[1]
    return "daily report" if description == "daily report" else "other"


def job_steps(jobs: list[dict[str, Any]]) -> dict[str, float]:
    """Median seconds per batch of each step of the purger's batches among ``jobs`` (``spark_jobs``)."""
    steps: dict[str, list[float]] = defaultdict(list)
    for job in jobs:
        kind = job_kind(job["description"])
        if kind not in ("daily report", "other"):
            steps[kind].append((job["end_ms"] - job["start_ms"]) / 1000)
    return {step: statistics.median(times) for step, times in steps.items()}


def _epoch_ms(stamp: str) -> float:
    """A time as the Spark UI's REST API writes it (2026-11-23T22:59:12.345GMT)."""
    return datetime.strptime(stamp.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000


class PeakMemory:
    """Samples ``process_tree_rss_mb`` every second in a thread; ``peak`` is the largest sum seen, and
    ``own_growth_mb`` how far this process's own resident memory rose above its size at the start."""

    def __init__(self) -> None:
        self.peak: dict[str, float] = {}
        self.own_growth_mb = 0.0
        self._own_start = _own_rss_mb()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(1.0):
            sample = process_tree_rss_mb()
            if sum(sample.values()) > sum(self.peak.values()):
                self.peak = sample
            self.own_growth_mb = max(self.own_growth_mb, _own_rss_mb() - self._own_start)


def _own_rss_mb() -> float:
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024
