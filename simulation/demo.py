"""The demo: a workload through the local stack, purged by the real job, and a report of what happened.

The platform stand-in writes messages (rows, blobs in two data centres, inline
payloads, payloads shared by two messages) and emits their events. Each message
follows one scenario of the mailbox rules (docs/reference.md, Rules): it expires by counter, by date, stays an
incomplete upload or is deleted, and some of those are revived (counter set
again, date moved, upload completed) before their deadline; the rest stay live.
The purger runs with short periods until every expected purge is seen in
Cassandra and S3, then the report compares what should have gone with what went.

Beside the messages, the other built-in policies run on objects of their own
(``simulation.policy_objects``): rule events, users across two data centres and
units of work, one eligible and one kept of each per twenty messages.

Example::

    from simulation.demo import run_demo
    report = run_demo(messages=200)
    report.ok  # True when exactly the eligible objects (and messages' unshared payloads) were purged
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from purger.core.config import PurgerConfig

from purger.config import build_config
from simulation.mailbox import Platform
from simulation.policy_objects import SETTINGS, PolicyObjects
from simulation.workload import SCENARIOS, Workload, is_purged, play
from devstack.stack import prepare
from purger.sinks.ledger import Report

@dataclass
class DemoReport:
    # scenario -> (expected, observed) message counts: purged for purge scenarios, kept otherwise
    scenarios: dict[str, tuple[int, int]] = field(default_factory=dict)
    # "<policy>: <kind> objects purged|kept" -> (expected, observed) counts, for the other policies
    objects: dict[str, tuple[int, int]] = field(default_factory=dict)
    wrongly_deleted: set[str] = field(default_factory=set)
    left_behind: set[str] = field(default_factory=set)
    payloads_expected_gone: int = 0
    payloads_gone: int = 0
    payloads_expected_kept: int = 0
    payloads_kept: int = 0
    blobs_left: dict[str, int] = field(default_factory=dict)  # per dc, of purged payloads
    # The daily purge report's rows (sinks.ledger.Report) for the demo's ledger.
    purge_report: list[Any] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            not self.wrongly_deleted and not self.left_behind
            and self.payloads_gone == self.payloads_expected_gone
            and self.payloads_kept == self.payloads_expected_kept
            and not any(self.blobs_left.values())
        )


def demo_config(run: str) -> PurgerConfig:
    work = Path(tempfile.mkdtemp(prefix=f"purger-demo-{run}-"))
    return build_config(
        {
            "kafka": {
                "topics": [f"demo.{run}.events"],
                "control_topic": f"demo.{run}.control",
                "dead_letter_topic": f"demo.{run}.dead-letter",
                "reconcile_topic": f"demo.{run}.reconcile",
            },
            "policies": {"mailbox": {"expired_ttl": "10s", "incomplete_ttl": "10s", "deleted_ttl": "0s",
                                     "payload_grace": "2s"}, **SETTINGS},
            "stream": {
                "query_name": f"purger-demo-{run}",
                "checkpoint": str(work / "checkpoint"),
                "trigger_interval": "1s",
                "watermark_delay": "2s",
                "clock_interval": "1s",
            },
            "ledger": {"path": str(work / "ledger" / "records"), "report_path": str(work / "ledger" / "report")},
        }
    )


def run_demo(messages: int = 200, timeout_s: float = 300, seed: int = 7) -> DemoReport:
    from purger.spark import spark_session
    from purger.running import start_purger

    started = time.monotonic()
    run = uuid.uuid4().hex[:8]
    config = demo_config(run)
    prepare(config)
    spark = spark_session(config.stream, app_name="purger-demo", log_level="ERROR")  # from the JVM's start
    running = start_purger(spark, config)
    platform, objects = Platform(config), PolicyObjects(config)
    report = DemoReport()
    scenario_of: dict[str, str] = {}
    payload_of: dict[str, str] = {}
    stored: set[str] = set()  # payloads kept in the object stores
    try:
        for plan in tqdm(list(Workload(seed=seed).plans(run, messages)), desc="platform", unit="msg"):
            scenario_of[plan.message] = plan.scenario
            payload_of[plan.message] = play(platform, plan)
            if plan.stored:
                stored.add(payload_of[plan.message])
        platform.flush()
        written = [o for i in tqdm(range(max(1, messages // 20)), desc="other policies", unit="set")
                   for o in objects.write(f"demo-{run}-{i}")]
        objects.flush()

        purged = {m for m, s in scenario_of.items() if is_purged(s)}
        referrers: dict[str, set[str]] = {}
        for m, p in payload_of.items():
            referrers.setdefault(p, set()).add(m)
        expected_gone = {p for p in stored if referrers[p] <= purged}

        pending = set(purged) | {f"payload:{p}" for p in expected_gone} | {o for o in written if o.eligible}

        def gone(x) -> bool:
            if not isinstance(x, str):
                return objects.gone(x)
            return platform.payload_gone(x[8:]) if x.startswith("payload:") else platform.row(x) is None

        with tqdm(total=len(pending), desc="purged", unit="obj") as bar:
            deadline = time.monotonic() + timeout_s
            while pending and time.monotonic() < deadline and running.query.isActive:
                gone_now = {x for x in pending if gone(x)}
                pending -= gone_now
                bar.update(len(gone_now))
                time.sleep(1)
        # A few triggers more, so that nothing kept is merely not deleted yet.
        time.sleep(3 * config.stream.trigger_interval.total_seconds())
        for name in SCENARIOS:
            members = [m for m, s in scenario_of.items() if s == name]
            if is_purged(name):
                report.scenarios[name] = (len(members), sum(platform.row(m) is None for m in members))
            else:
                report.scenarios[name] = (len(members), sum(platform.row(m) is not None for m in members))
        for o in written:
            what = f"{o.policy}: {o.kind} objects {'purged' if o.eligible else 'kept'}"
            expected, observed = report.objects.get(what, (0, 0))
            found = objects.gone(o) if o.eligible else objects.intact(o)
            report.objects[what] = (expected + 1, observed + found)
        report.wrongly_deleted = {m for m in scenario_of if m not in purged and platform.row(m) is None}
        report.wrongly_deleted |= {o.id for o in written if not o.eligible and not objects.intact(o)}
        report.left_behind = {m for m in purged if platform.row(m) is not None}
        report.left_behind |= {o.id for o in written if o.eligible and not objects.gone(o)}
        report.payloads_expected_gone = len(expected_gone)
        report.payloads_gone = sum(platform.payload_gone(p) for p in expected_gone)
        kept = stored - expected_gone
        report.payloads_expected_kept = len(kept)
        report.payloads_kept = sum(platform.payload_intact(p) for p in kept)
        report.blobs_left = {dc: sum(platform.blob_exists(p, dc) for p in expected_gone) for dc in config.stores}
    finally:
        running.stop()
        platform.close()
        objects.close()
    purge_report = Report(spark, config.ledger, config.policy_set)
    purge_report.refresh()
    report.purge_report = purge_report.rows(datetime.now(timezone.utc).date())
    report.seconds = time.monotonic() - started
    return report
