"""The demo: a workload through the local stack, purged by the real job, and a report of what happened.

The platform stand-in writes messages (rows, blobs in two data centres, inline
payloads) and emits their events. Some expire by counter; a share of those is
revived before its deadline; the rest stay live. The purger runs with short
periods until every expected purge is seen in Cassandra and S3, then the
report compares what should have gone with what went.

Example::

    from purger.demo import run_demo
    report = run_demo(messages=200)
    report.ok  # True when exactly the expired messages were purged
"""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from tqdm import tqdm

from purger.config import PurgerConfig, build_config
from purger.platform import INLINE_LIMIT, Platform
from purger.stack import prepare


@dataclass
class DemoReport:
    expected_purged: set[str] = field(default_factory=set)
    expected_kept: set[str] = field(default_factory=set)
    purged: set[str] = field(default_factory=set)
    wrongly_deleted: set[str] = field(default_factory=set)
    blobs_left: dict[str, int] = field(default_factory=dict)  # per dc, of purged messages
    blobs_kept: dict[str, int] = field(default_factory=dict)  # per dc, of kept messages
    sink_totals: dict[tuple[str, str], int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.purged == self.expected_purged
            and not self.wrongly_deleted
            and not any(self.blobs_left.values())
        )


def demo_config(run: str) -> PurgerConfig:
    return build_config(
        {
            "kafka": {"topics": [f"demo.{run}.events"], "control_topic": f"demo.{run}.control", "dead_letter_topic": f"demo.{run}.dead-letter"},
            "retention": {"expired_ttl": "10s"},
            "stream": {
                "query_name": f"purger-demo-{run}",
                "checkpoint": tempfile.mkdtemp(prefix=f"purger-demo-{run}-"),
                "trigger_interval": "1s",
                "watermark_delay": "2s",
                "clock_interval": "1s",
            },
        }
    )


def run_demo(messages: int = 200, timeout_s: float = 300, seed: int = 7) -> DemoReport:
    from purger.spark import spark_session
    from streams.query import start_purger

    started = time.monotonic()
    run = uuid.uuid4().hex[:8]
    config = demo_config(run)
    prepare(config)
    spark = spark_session(config.stream, app_name="purger-demo")
    spark.sparkContext.setLogLevel("ERROR")
    running = start_purger(spark, config)
    platform = Platform(config)
    report = DemoReport()
    chooser = random.Random(seed)
    payload_of: dict[str, str] = {}
    inline: set[str] = set()
    try:
        for i in tqdm(range(messages), desc="enqueue", unit="msg"):
            message = f"{run}-m{i:05d}"
            payload_of[message] = f"{run}-p{i:05d}"
            size = 200 if chooser.random() < 0.1 else 32 * 1024
            if size < INLINE_LIMIT:
                inline.add(message)
            platform.enqueue(message, payload_of[message], extract_count=2, size=size)
        revive = []
        for message in payload_of:
            roll = chooser.random()
            if roll < 0.6:  # expires: extracted twice
                platform.dequeue(message, 1)
                platform.dequeue(message, 0)
                if chooser.random() < 0.25:
                    revive.append(message)
                else:
                    report.expected_purged.add(message)
            else:  # stays live, extracted once or not at all
                if roll < 0.8:
                    platform.dequeue(message, 1)
                report.expected_kept.add(message)
        platform.flush()
        time.sleep(1)
        for message in revive:  # an administrator revives them before their deadline
            platform.set_counter(message, 1)
        report.expected_kept.update(revive)
        platform.flush()

        pending = set(report.expected_purged)
        with tqdm(total=len(pending), desc="purged", unit="msg") as bar:
            deadline = time.monotonic() + timeout_s
            while pending and time.monotonic() < deadline and running.query.isActive:
                gone = {m for m in pending if platform.row(m) is None}
                pending -= gone
                bar.update(len(gone))
                time.sleep(1)
        # A few triggers more, so blob deletes that follow the last row deletes have landed.
        time.sleep(3 * config.stream.trigger_interval.total_seconds())
        report.purged = {m for m in report.expected_purged if platform.row(m) is None}
        report.wrongly_deleted = {m for m in report.expected_kept if platform.row(m) is None}
        for dc in config.stores:
            report.blobs_left[dc] = sum(
                platform.blob_exists(payload_of[m], dc) for m in report.purged if m not in inline
            )
            report.blobs_kept[dc] = sum(
                platform.blob_exists(payload_of[m], dc) for m in report.expected_kept if m not in inline
            )
        report.sink_totals = dict(running.sink.totals)
    finally:
        running.stop()
        platform.close()
    report.seconds = time.monotonic() - started
    return report
