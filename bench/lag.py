"""Purge lag (deletion time minus eligibility time) at the default trigger, and throughput over a run, plotted.

    python -m bench.lag --rate 20 --seconds 300

The platform plays the default workload (rows, blobs in two data centres,
shared and inline payloads, 5% of messages with late events, 5% sent twice) at
``--rate`` messages per second while the purger runs with the default stream
settings (the trigger, watermark delay and clock of ``StreamConfig``) and retention periods
shortened to seconds. Once the platform stops, the run waits until every
eligible message is purged, then reads the ledger: lag percentiles per kind
and, per 10 s of the run, events in, deletions and lag, plotted to
``bench/lag.png``. The baseline for the lag is what the settings alone make
inevitable: the watermark delay plus one trigger interval.

``--set section.key=value`` (repeatable) runs it with a setting other than its
default, to compare a lever against the defaults in back-to-back runs:

    python -m bench.lag --rate 20 --seconds 300 --set ledger.report_interval=10m

Its profile: each batch's duration beside the Spark jobs that ran while it did
(the sink's steps, the daily report's refresh, Delta's own), from the Spark
UI's REST API; the slowest batches are what make the p99. The purge job's
stages, median per batch, say where that job's time goes.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np
from pyspark.sql import functions as F

from bench.common import (BenchRun, epoch_s, job_kind, job_steps, overrides, spark_jobs, spark_stages,
                          stage_profile)
from simulation.mailbox import Platform
from simulation.workload import Workload, is_purged, play_all
from purger.sinks.ledger import Ledger
from purger.running import start_purger

PLOT = Path(__file__).parent / "lag.png"
BUCKET_S = 10
WARM_S = 120
TARGETS = {"message": "p99 < 15 s", "payload": "p99 < 20 s"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=20, help="messages per second")
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting other than its default, e.g. stream.watermark_delay=2s")
    args = parser.parse_args()
    run = BenchRun.start("lag", policies={"mailbox": {"expired_ttl": "20s", "incomplete_ttl": "20s",
                                                      "deleted_ttl": "0s", "payload_grace": "5s"}},
                         **overrides(args.set))
    config = run.config
    spark = run.spark()
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")  # every batch of the run, not 100
    running = start_purger(spark, config)
    platform = Platform(config)
    expected = 0
    counted = threading.Lock()

    def played(plan, payload) -> None:
        nonlocal expected
        if is_purged(plan.scenario):
            with counted:
                expected += 1

    started = time.time()
    jobs: list[dict] = []
    stages: dict[int, dict] = {}
    try:
        messages = int(args.rate * args.seconds)
        workload = Workload(late_share=0.05, duplicate_share=0.05)
        play_all(platform, workload.plans(run.run, messages), rate=args.rate, on_played=played)
        played_s = time.time() - started
        deadline = time.monotonic() + 300
        while running.sink.totals[("message", "purged")] < expected and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(30)  # the payloads of the last messages: released, then their grace
        progress = [json.loads(p.json) for p in running.query.recentProgress]
        jobs = spark_jobs(spark, started * 1000)
        stages = spark_stages(spark)
    finally:
        running.stop()
        platform.close()
    run.record("workload generator (rows, blobs, events)", messages / played_s, "messages/s", messages=messages)

    records = (Ledger(spark, config.ledger).records()
               .where((F.col("status") == "purged") & F.col("dc").isNull())
               .select("kind", "lag_s", F.col("deleted_at").cast("double").alias("deleted_s")).collect())
    purged_messages = sum(r["kind"] == "message" for r in records)
    if purged_messages < expected:
        raise RuntimeError(f"{purged_messages} of {expected} eligible messages purged")
    floor = config.stream.watermark_delay.total_seconds() + config.stream.trigger_interval.total_seconds()
    for kind in ("message", "payload"):
        lags = np.array([r["lag_s"] for r in records if r["kind"] == kind])
        for p in (50, 99):
            run.record(f"purge lag p{p}, {kind}s", float(np.percentile(lags, p)), "s",
                       baseline=("watermark delay + trigger interval", floor),
                       target=TARGETS[kind] if p == 99 else None, deletions=len(lags), rate=args.rate,
                       trigger_s=config.stream.trigger_interval.total_seconds(),
                       watermark_delay_s=config.stream.watermark_delay.total_seconds(), settings=args.set)
        # A start's first batches (a new JVM, new Python workers, the clients' connections) against the rest.
        steady = np.array([r["lag_s"] for r in records if r["kind"] == kind and r["deleted_s"] >= started + WARM_S])
        run.record(f"purge lag p99, {kind}s, after the first {WARM_S} s", float(np.percentile(steady, 99)), "s",
                   baseline=("watermark delay + trigger interval", floor), deletions=len(steady), rate=args.rate,
                   settings=args.set)
    # What the lag is made of: how long the batches took (the sink's part is addBatch).
    (run.work / "progress.jsonl").write_text("".join(json.dumps(p) + "\n" for p in progress))
    for part in ("triggerExecution", "addBatch"):
        durations = np.array([p["durationMs"].get(part, 0) / 1000 for p in progress if p["numInputRows"]])
        for q in (50, 99):
            run.record(f"batch duration p{q} ({part})", float(np.percentile(durations, q)), "s",
                       baseline=("trigger interval", config.stream.trigger_interval.total_seconds()),
                       batches=len(durations), rate=args.rate)
        if part == "triggerExecution":
            first = next(p for p in progress if p["batchId"] == 0)
            run.record("first batch duration", first["durationMs"][part] / 1000, "s",
                       baseline=("batch duration p50", float(np.median(durations))), settings=args.set)
    # Its profile: the Spark jobs of each step of the sink's batches (the UI's job descriptions).
    for step, seconds in sorted(job_steps(jobs).items()):
        run.record(f"batch step median ({step} job)", seconds, "s", rate=args.rate)
    for stage, measures in sorted(stage_profile(jobs, stages, "purge candidates").items()):
        print(f"purge candidates job, {stage}: " + ", ".join(f"{m} {v:.2f}" for m, v in measures.items()), flush=True)
        run.record(f"purge candidates job median, {stage}", measures["wall_s"], "s", rate=args.rate,
                   **{m: round(v, 3) for m, v in measures.items() if m != "wall_s"})
    slowest_batches(run, progress, jobs, report_interval_s=config.ledger.report_interval.total_seconds())
    plot(records, progress, started, floor)


def slowest_batches(run: BenchRun, progress: list[dict], jobs: list[dict], report_interval_s: float) -> None:
    """What made the slow batches slow: the median duration of the batches during which the daily
    report's refresh ran, against the others', and the seconds of each kind of job that ran within the
    slowest 5% of batches."""
    batches = []
    for p in progress:
        if p["numInputRows"]:
            start = epoch_s(p["timestamp"]) * 1000
            end = start + p["durationMs"]["triggerExecution"]
            within: dict[str, float] = {}
            for job in jobs:
                overlap = min(end, job["end_ms"]) - max(start, job["start_ms"])
                if overlap > 0:
                    kind = job_kind(job["description"])
                    within[kind] = within.get(kind, 0) + overlap / 1000
            batches.append(((end - start) / 1000, within))
    beside_report = [d for d, within in batches if "daily report" in within]
    alone = [d for d, within in batches if "daily report" not in within]
    if beside_report and alone:
        run.record("batch duration p50, while the daily report refreshed", float(np.median(beside_report)), "s",
                   baseline=("the other batches", float(np.median(alone))), batches=len(beside_report),
                   report_interval_s=report_interval_s)
    slow = sorted(batches, key=lambda b: b[0])[-max(1, len(batches) // 20):]
    seconds_by_kind: dict[str, float] = {}
    for _, within in slow:
        for kind, seconds in within.items():
            seconds_by_kind[kind] = seconds_by_kind.get(kind, 0) + seconds / len(slow)
    print(f"slowest {len(slow)} batches ({min(d for d, _ in slow):.1f}-{max(d for d, _ in slow):.1f} s): "
          "jobs running within them, seconds per batch: "
          + ", ".join(f"{kind} {s:.2f}" for kind, s in sorted(seconds_by_kind.items(), key=lambda kv: -kv[1])),
          flush=True)
    run.record("slowest 5% of batches, median duration", float(np.median([d for d, _ in slow])), "s",
               batches=len(slow), jobs_within_s={k: round(v, 2) for k, v in seconds_by_kind.items()})


def plot(records, progress: list[dict], started: float, floor: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max(r["deleted_s"] for r in records)
    edges = np.arange(started, end + BUCKET_S, BUCKET_S)
    middles = (edges[:-1] - started + BUCKET_S / 2)
    deleted = np.array([r["deleted_s"] for r in records])
    lags = np.array([r["lag_s"] for r in records])
    deletions = np.histogram(deleted, edges)[0] / BUCKET_S
    p50, p99 = ([np.percentile(lags[(deleted >= a) & (deleted < b)], q) if ((deleted >= a) & (deleted < b)).any()
                 else np.nan for a, b in zip(edges[:-1], edges[1:])] for q in (50, 99))
    batch_at = np.array([epoch_s(p["timestamp"]) for p in progress])
    batch_rows = np.array([p["numInputRows"] for p in progress])
    events_in = np.array([batch_rows[(batch_at >= a) & (batch_at < b)].sum() for a, b in zip(edges[:-1], edges[1:])])

    figure, (rates, lag) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    rates.plot(middles, events_in / BUCKET_S, label="events read (per s)")
    rates.plot(middles, deletions, label="purges: messages and payloads (per s)")
    rates.set_ylabel("per second")
    rates.legend()
    rates.set_title("Purger under a steady workload: throughput and purge lag per 10 s")
    lag.plot(middles, p50, label="lag p50")
    lag.plot(middles, p99, label="lag p99")
    lag.axhline(floor, linestyle=":", color="grey", label="watermark delay + trigger")
    lag.axhline(15, linestyle="--", color="red", label="target p99, messages")
    lag.set_ylabel("seconds")
    lag.set_xlabel("seconds into the run")
    lag.legend()
    figure.tight_layout()
    figure.savefig(PLOT, dpi=100)
    print(f"plot: {PLOT}")


if __name__ == "__main__":
    main()
