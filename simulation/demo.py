"""The demo: a platform that already has data, a workload through the local stack, purged by the real job, and
a report of what happened.

The platform stand-in writes messages (rows, blobs in two data centres, inline
payloads, payloads shared by two messages) and emits their events. Each message
follows one scenario of the mailbox rules (docs/reference.md, Rules): it expires by counter, by date, stays an
incomplete upload or is deleted, and some of those are revived (counter set
again, date moved, upload completed) before their deadline; the rest stay live.

Beside the messages, the other built-in policies run on objects of their own
(``simulation.policy_objects``): rule events, users across two data centres and
units of work, one eligible and one kept of each per twenty messages.

The platform has data before the purger starts (docs/reconciliation.md, Adopting the purger): one message
in four, and one eligible and one kept object of each other policy, are written with their events sent to
a topic the purger does not read, as if the platform had run before it; so are a few orphan blobs (under
``payloads/`` in each data centre, with no row) and a blob outside ``payloads/``, which must stay. The
purger's first scheduled reconcile, at its start, finds them; the rest of the workload is played once it is
recorded, with events. The purger runs with short periods until every expected purge is seen in Cassandra
and S3, then the report compares what should have gone with what went, existing objects included. Beside
them, a mailbox under a legal hold (docs/operations.md, Legal holds): its due messages are kept while the
hold stands, and purged once the demo releases it; a mailbox of live messages erased on request
(docs/operations.md, Erasure on request): its messages and payloads go at once, as its certificate says; and
an undo (docs/operations.md, Undo): due messages purged, then put back by a restore with their payloads, held.

The demo writes into a keyspace (``demo_<run>``), buckets (``demo-<run>-<dc>``), topics (``demo.<run>.*``)
and a work directory (checkpoint, ledger, reports) of its own, and leaves them for a look afterwards
(``DemoReport.where``): a reconcile scans whole tables and takes every blob under ``payloads/`` without a
row for an orphan, so it must not see other runs' data.

Example::

    from devstack.stack import prepare
    from simulation.demo import run_demo
    report = run_demo(prepare, messages=200)
    report.ok  # True when exactly the eligible objects (and messages' unshared payloads) were purged
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from purger.core.settings import PurgerConfig

from purger.config import build_config
from purger.core.holds import Scope
from purger.erase import find_objects, new_request, send_erasure, wait_for_certificate
from purger.holds import holds_in_force, place_hold, release_hold
from purger.policies.mailbox.deletes import payload_key
from simulation.mailbox import Platform
from simulation.policy_objects import SETTINGS, PolicyObjects
from simulation.workload import SCENARIOS, Workload, is_purged, play
from purger.sinks.ledger import Report

EXISTING_SHARE = 4  # one message in four exists before the purger starts
HELD = 3  # due messages of a mailbox under a legal hold
ERASED = 3  # live messages of a mailbox erased on request
UNDONE = 3  # due messages purged, then restored (the demo's purger keeps an undo window)
ORPHANS = 3  # orphan blobs in each data centre's bucket
# A blob the platform keeps outside payloads/: no reconcile lists it.
OUTSIDE_KEY = "exports/demo-{run}.csv"
# What the demo calls the objects written before the purger, with no events it reads.
EXISTING = "existing, no events"


@dataclass
class DemoReport:
    # scenario -> (expected, observed) message counts: purged for purge scenarios, kept otherwise
    scenarios: dict[str, tuple[int, int]] = field(default_factory=dict)
    # "<policy>: <kind> objects purged|kept" -> (expected, observed) counts, for the other policies (existing
    # objects included)
    objects: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Of those, the objects that existed before the purger (no events it reads), and what its reconcile
    # fed back: "<what>" -> (expected, observed).
    existing: dict[str, tuple[int, int]] = field(default_factory=dict)
    existing_messages: int = 0
    # A mailbox under a legal hold: "<what>" -> (expected, observed): its due messages kept while it stands,
    # then purged once it is released.
    held: dict[str, tuple[int, int]] = field(default_factory=dict)
    # A mailbox of live messages erased on request: "<what>" -> (expected, observed).
    erased: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Due messages purged, then restored: "<what>" -> (expected, observed).
    undone: dict[str, tuple[int, int]] = field(default_factory=dict)
    wrongly_deleted: set[str] = field(default_factory=set)
    left_behind: set[str] = field(default_factory=set)
    payloads_expected_gone: int = 0
    payloads_gone: int = 0
    payloads_expected_kept: int = 0
    payloads_kept: int = 0
    blobs_left: dict[str, int] = field(default_factory=dict)  # per dc, of purged payloads
    # Orphan blobs (payloads/<id> with no row), per dc: (written, deleted).
    orphans: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Blobs outside payloads/: (written, still there).
    outside_kept: tuple[int, int] = (0, 0)
    # The daily purge report's rows (sinks.ledger.Report) for the demo's ledger.
    purge_report: list[Any] = field(default_factory=list)
    # The reconcile runs' report rows (purger.reconcile.verdict.ReportRow), from ledger.reconcile_path.
    reconcile: list[Any] = field(default_factory=list)
    # Where the demo's data stays for a look: "<what>" -> where.
    where: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            not self.wrongly_deleted and not self.left_behind
            and self.payloads_gone == self.payloads_expected_gone
            and self.payloads_kept == self.payloads_expected_kept
            and not any(self.blobs_left.values())
            and bool(self.reconcile)
            and all(expected == observed for expected, observed in self.existing.values())
            and bool(self.held) and all(expected == observed for expected, observed in self.held.values())
            and bool(self.erased) and all(expected == observed for expected, observed in self.erased.values())
            and bool(self.undone) and all(expected == observed for expected, observed in self.undone.values())
            and all(written == deleted for written, deleted in self.orphans.values())
            and self.outside_kept[0] == self.outside_kept[1]
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
            # A keyspace and buckets of the run's own: a reconcile scans whole tables and lists whole buckets.
            "cassandra": {"keyspace": f"demo_{run}"},
            "stores": {dc: {"bucket": f"demo-{run}-{dc}"} for dc in ("dc1", "dc2")},
            "policies": {"mailbox": {"expired_ttl": "10s", "incomplete_ttl": "10s", "deleted_ttl": "0s",
                                     "payload_grace": "2s"}, **SETTINGS},
            "stream": {
                "query_name": f"purger-demo-{run}",
                "checkpoint": str(work / "checkpoint"),
                "trigger_interval": "1s",
                "watermark_delay": "2s",
                "clock_interval": "1s",
            },
            "ledger": {"path": str(work / "ledger" / "records"), "report_path": str(work / "ledger" / "report"),
                       "reconcile_path": str(work / "ledger" / "reconcile_report")},
            # Each deletion restorable for an hour (docs/operations.md, Undo): the demo restores some.
            "undo": {"window": "1h"},
            "reconcile": {
                # No run is recorded in the demo's new ledger, so the running purger reconciles at its
                # start; the next would come an hour later, after the demo.
                "interval": "1h",
                # The demo's orphan blobs are seconds old, and nothing uploads while the reconcile lists the
                # buckets (the workload waits for it): a grace of seconds deletes them and no upload's blob.
                "orphan_grace": "2s",
                "orphan_grace_check": False,
            },
        }
    )


def silent_config(config: PurgerConfig, run: str) -> PurgerConfig:
    """``config`` with its events sent to a topic the purger does not read: the platform before the purger."""
    return config.model_copy(update={"kafka": config.kafka.model_copy(update={"topics": [f"demo.{run}.unread"]})})


def where(config: PurgerConfig) -> dict[str, str]:
    """Where the demo's data stays: the keyspace, buckets, topics and the work directory."""
    cassandra, stores = config.cassandra, config.stores
    endpoints = sorted({store.endpoint for store in stores.values()})
    topics = config.kafka.topics[0].rsplit(".", 1)[0] + ".*"
    return {
        "keyspace": f"{cassandra.keyspace} (Cassandra {cassandra.hosts[0]}:{cassandra.port})",
        "buckets": f"{', '.join(s.bucket for _, s in sorted(stores.items()))} ({', '.join(endpoints)})",
        "topics": f"{topics} (Kafka {config.kafka.bootstrap_servers})",
        "checkpoint, ledger": str(Path(config.stream.checkpoint_location).parent),
    }


def recorded_reconciles(spark: Any, config: PurgerConfig) -> list[Any]:
    """The reconcile runs recorded at ``ledger.reconcile_path``, as ``ReportRow``s in the order of a run."""
    from dataclasses import fields

    from delta.tables import DeltaTable

    from purger.reconcile.verdict import ReportRow

    path = config.ledger.reconcile_path
    if not DeltaTable.isDeltaTable(spark, path):
        return []
    rows = []
    for recorded in spark.read.format("delta").load(path).orderBy("started").collect():
        values = recorded.asDict()
        row = ReportRow(**{f.name: values[f.name] for f in fields(ReportRow) if f.init})
        row.duration_s, row.rows_per_s = values["duration_s"], values["rows_per_s"]
        rows.append(row)
    return rows


def held_then_released(platform: Platform, config: PurgerConfig, scope: Scope, held: list[str],
                       timeout_s: float) -> dict[str, tuple[int, int]]:
    """The held mailbox's due messages: found held (each decided once), kept, then purged after the release."""
    def kept_under_hold() -> int:
        return next((count for hold, count in holds_in_force(config) if hold.scope == str(scope)), 0)

    with tqdm(total=len(held), desc="decided held", unit="msg") as bar:
        deadline = time.monotonic() + timeout_s
        while kept_under_hold() < len(held) and time.monotonic() < deadline:
            time.sleep(1)
        bar.update(kept_under_hold())
    found = {"legal hold on a mailbox: due messages kept": (len(held), sum(platform.row(m) is not None for m in held))}
    release_hold(config, scope)
    with tqdm(total=len(held), desc="released, purged", unit="msg") as bar:
        deadline = time.monotonic() + timeout_s
        while any(platform.row(m) is not None for m in held) and time.monotonic() < deadline:
            time.sleep(1)
        bar.update(sum(platform.row(m) is None for m in held))
    found["legal hold released: those messages purged"] = (len(held), sum(platform.row(m) is None for m in held))
    return found


def erased_on_request(spark: Any, platform: Platform, config: PurgerConfig, run: str, timeout_s: float
                      ) -> dict[str, tuple[int, int]]:
    """A mailbox of live messages (stored payloads) erased through the running purger: each message and payload
    gone from Cassandra and both stores, and the certificate lists every one of those deletions."""
    subject = Scope("mailbox", f"demo-{run}-erased")
    messages = [f"{run}-erased-{i}" for i in range(ERASED)]
    for m in messages:  # never dequeued: live for years
        platform.enqueue(m, f"p-{m}", mailbox=subject.id)
    platform.flush()
    request = new_request()
    asked = find_objects(spark, config, subject)
    send_erasure(config, asked, request)
    done = wait_for_certificate(spark, config, subject, request, asked, timeout_s, say=lambda line: None)
    listed = {(e.kind, e.id) for e in done.deleted}
    return {
        "erased on request: live messages gone": (len(messages), sum(platform.row(m) is None for m in messages)),
        "erased on request: their payloads gone": (len(messages), sum(platform.payload_gone(f"p-{m}")
                                                                      for m in messages)),
        "erased on request: in the certificate": (2 * len(messages), sum(
            (kind, object_id) in listed for m in messages for kind, object_id in (("message", m), ("payload", f"p-{m}")))),
    }


def undone(spark: Any, platform: Platform, config: PurgerConfig, run: str, timeout_s: float
           ) -> dict[str, tuple[int, int]]:
    """Due messages (stored payloads) purged, then restored as `purger restore` does: each row and payload back in
    Cassandra and both stores, each message held so that the purger does not delete it again."""
    from purger.core.times import now_ms
    from purger.restore import new_run, plan_restore, restore

    began = now_ms()
    messages = [f"{run}-undone-{i}" for i in range(UNDONE)]
    for m in messages:
        platform.enqueue(m, f"p-{m}", mailbox=f"demo-{run}-undone")
        platform.dequeue(m, 0)
    platform.flush()
    with tqdm(total=len(messages), desc="purged, to undo", unit="msg") as bar:
        deadline = time.monotonic() + timeout_s
        while (not all(platform.row(m) is None and platform.payload_gone(f"p-{m}") for m in messages)
               and time.monotonic() < deadline):
            time.sleep(1)
        bar.update(sum(platform.row(m) is None for m in messages))
    # What a restore finds is what the ledger recorded: a batch records its deletions once they are done.
    ids = messages + [f"p-{m}" for m in messages]
    deadline = time.monotonic() + timeout_s
    while (len(plan := plan_restore(spark, config, "mailbox", began, now_ms(), ids=ids)) < 5 * len(messages)
           and time.monotonic() < deadline):
        time.sleep(1)
    done = restore(spark, config, "mailbox", plan, new_run(), "demo", "demo: a policy wrong by a unit")
    held = {hold.scope for hold, _ in holds_in_force(config)}
    return {
        "undo: purged messages restored": (len(messages), sum(platform.row(m) is not None for m in messages)),
        "undo: their payloads restored, blobs in each store": (len(messages), sum(platform.payload_intact(f"p-{m}")
                                                                                  for m in messages)),
        "undo: restored messages held": (len(messages), sum(f"message:{m}" in held for m in messages)),
        # Each message's row and reference, its payload's row and its blob in each of the two stores.
        "undo: deletions recorded restored": (5 * len(messages), len(done.restored)),
    }


def run_demo(prepare: Callable[..., None], messages: int = 200, timeout_s: float = 300,
             seed: int = 7) -> DemoReport:
    """The demo on the servers ``prepare(config, partitions=...)`` gives the topics, keyspace and buckets of a
    configuration (the local stack's ``devstack.stack.prepare``): its report."""
    from purger.spark import spark_session
    from purger.running import start_purger

    started = time.monotonic()
    run = uuid.uuid4().hex[:8]
    config = demo_config(run)
    silent = silent_config(config, run)
    prepare(config)
    prepare(silent, partitions=1)  # the topic nobody reads
    report = DemoReport(where=where(config))
    plans = list(Workload(seed=seed).plans(run, messages))
    scenario_of: dict[str, str] = {}
    payload_of: dict[str, str] = {}
    stored: set[str] = set()  # payloads kept in the object stores

    def play_plans(platform: Platform, chosen: list, desc: str) -> None:
        for plan in tqdm(chosen, desc=desc, unit="msg"):
            scenario_of[plan.message] = plan.scenario
            payload_of[plan.message] = play(platform, plan)
            if plan.stored:
                stored.add(payload_of[plan.message])
        platform.flush()

    # The platform before the purger: rows and blobs whose events the purger never reads, orphan blobs,
    # and a blob outside payloads/.
    before, before_objects = Platform(silent), PolicyObjects(silent)
    existing_plans = plans[::EXISTING_SHARE]
    orphans = [f"{run}-orphan-{i}" for i in range(ORPHANS)]
    outside = OUTSIDE_KEY.format(run=run)
    try:
        play_plans(before, existing_plans, "existing messages")
        existing = before_objects.write(f"demo-{run}-existing")
        before_objects.flush()
        for dc, store in config.stores.items():
            for orphan in orphans:
                before.stores[dc].put_object(Bucket=store.bucket, Key=payload_key(orphan), Body=b"no row")
        before.stores["dc1"].put_object(Bucket=config.stores["dc1"].bucket, Key=outside, Body=b"kept\n")
    finally:
        before.close()
        before_objects.close()
    existing_messages = {plan.message for plan in existing_plans}

    spark = spark_session(config.stream, app_name="purger-demo", log_level="ERROR")  # from the JVM's start
    running = start_purger(spark, config)
    platform, objects = Platform(config), PolicyObjects(config)
    try:
        # The purger's first scheduled reconcile, at its start; the workload with events waits for it, so
        # that it finds exactly the existing data.
        with tqdm(total=1, desc="reconcile at start", unit="run") as bar:
            deadline = time.monotonic() + timeout_s
            while not report.reconcile and time.monotonic() < deadline and running.query.isActive:
                time.sleep(1)
                report.reconcile = recorded_reconciles(spark, config)
            bar.update(bool(report.reconcile))

        # A legal hold on a mailbox, then messages of it made due: kept until the hold is released.
        held_scope = Scope("mailbox", f"demo-{run}-held")
        place_hold(spark, config, held_scope, "demo: a litigation hold", "demo", wait_s=timeout_s)
        held = [f"{run}-held-{i}" for i in range(HELD)]
        for m in held:
            platform.enqueue(m, f"p-{m}", size=100, mailbox=held_scope.id)
            platform.dequeue(m, 0)
        play_plans(platform, [plan for plan in plans if plan.message not in existing_messages], "platform")
        written = [o for i in tqdm(range(max(1, messages // 20)), desc="other policies", unit="set")
                   for o in objects.write(f"demo-{run}-{i}")]
        objects.flush()
        written += existing

        purged = {m for m, s in scenario_of.items() if is_purged(s)}
        referrers: dict[str, set[str]] = {}
        for m, p in payload_of.items():
            referrers.setdefault(p, set()).add(m)
        expected_gone = {p for p in stored if referrers[p] <= purged}

        pending: set[Any] = (set(purged) | {("payload", p) for p in expected_gone} | {o for o in written if o.eligible}
                             | {("orphan", dc, o) for dc in config.stores for o in orphans})

        def gone(x) -> bool:
            if isinstance(x, str):
                return platform.row(x) is None
            if not isinstance(x, tuple):
                return objects.gone(x)
            if x[0] == "payload":
                return platform.payload_gone(x[1])
            return not platform.blob_exists(x[2], x[1])  # an orphan blob

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
        report.existing_messages = len(existing_messages)
        existing_purged, existing_kept = existing_messages & purged, existing_messages - purged
        messages_table = config.policy_set.policy_of("message").settings.messages_table
        report.existing = {
            f"{EXISTING}: messages purged": (len(existing_purged),
                                             sum(platform.row(m) is None for m in existing_purged)),
            f"{EXISTING}: messages kept": (len(existing_kept), sum(platform.row(m) is not None for m in existing_kept)),
            f"{EXISTING}: other policies' objects purged": (sum(o.eligible for o in existing),
                                                            sum(objects.gone(o) for o in existing if o.eligible)),
            f"{EXISTING}: other policies' objects kept": (sum(not o.eligible for o in existing),
                                                          sum(objects.intact(o) for o in existing if not o.eligible)),
            # Every existing message is a row the stream did not know: the reconcile fed each back.
            f"{EXISTING}: messages fed back": (len(existing_messages), sum(
                r.unknown_fed for r in report.reconcile if (r.policy, r.table) == ("mailbox", messages_table))),
        }
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
        report.orphans = {dc: (len(orphans), sum(not platform.blob_exists(o, dc) for o in orphans))
                          for dc in config.stores}
        listing = platform.stores["dc1"].list_objects_v2(Bucket=config.stores["dc1"].bucket, Prefix=outside)
        report.outside_kept = (1, sum(item["Key"] == outside for item in listing.get("Contents", [])))
        report.held = held_then_released(platform, config, held_scope, held, timeout_s)
        report.erased = erased_on_request(spark, platform, config, run, timeout_s)
        report.undone = undone(spark, platform, config, run, timeout_s)
    finally:
        running.stop()
        platform.close()
        objects.close()
    purge_report = Report(spark, config.ledger, config.policy_set)
    purge_report.refresh()
    report.purge_report = purge_report.rows(datetime.now(timezone.utc).date())
    report.reconcile = recorded_reconciles(spark, config)
    report.seconds = time.monotonic() - started
    return report
