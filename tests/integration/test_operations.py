"""Operating the purger on the real servers: the ledger across forced retries, the daily report, the
throttle, the metrics of a running query, a dry run, and a replay into a fresh checkpoint.

The tests of this module share topics and a checkpoint of their own and run in order: the replay at
the end replays everything the earlier tests sent.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from devstack.stack import create_topics
from purger.config import with_policies
from purger.core.settings import PurgerConfig, S3Endpoint
from simulation.mailbox import Platform
from simulation.policy_objects import SETTINGS, PolicyObjects, ledger_rows
from purger.replay import follow, start_replay
from purger.core.vocabulary import EARLIER_ATTEMPT, STATUSES
from purger.sinks.ledger import LAG_PERCENTILES, Ledger, Report
from purger.sinks.purge import OUTCOME_SCHEMA
from purger.running import start_purger
from purger.core.policy import key_id
from tests.support.configs import mailbox, own_config
from tests.support.mailbox import deletable
from tests.support.report import ranked_within
from tests.support.waits import ago, now, observed, ui_jobs, wait_for, wait_for_watermark

pytestmark = pytest.mark.integration

CAP = 4  # deletions per second


@pytest.fixture(scope="module")
def ops(config, tmp_path_factory) -> PurgerConfig:
    every_policy = with_policies(config, {**config.policies, **SETTINGS})
    return own_config(every_policy, tmp_path_factory.mktemp("ops"), "ops", max_deletions_per_second=CAP)


@pytest.fixture(scope="module")
def ops_platform(ops):
    platform = Platform(ops)
    yield platform
    platform.close()


def kept_by_the_double_check(platform: Platform, config: PurgerConfig, tag: str,
                             sent: dict[str, bool] | None = None) -> str:
    """A `delete` event for a row that is not deleted (say, restored since): the double-check keeps it."""
    m = f"{tag}-{uuid.uuid4().hex[:6]}"
    platform.enqueue(m, f"p-{m}", extract_count=2)
    platform.emit("delete", m, at=ago(mailbox(config).deleted_ttl))
    platform.flush()
    if sent is not None:
        sent[m] = True
    return m


def purged(ledger: Ledger):
    return ledger.records().where(F.col("status") == "purged")


def test_the_ledger_holds_one_record_per_deletion_across_forced_retries(spark, ops, ops_platform, monkeypatch):
    """A batch fails once after its ledger write and another once before it; each is retried from the
    checkpoint. Every deletion has exactly one `purged` record, and the cap on deletions holds."""
    failures: list[str] = []
    failed_batches: list[int] = []
    appends: list[tuple[int, bool]] = []  # (batch, may hold records already) of each call
    original = Ledger.append

    def failing_append(self, outcomes, query_id, batch_id, may_hold=True, began_ms=None):
        appends.append((batch_id, may_hold))
        deletes = outcomes.where((F.col("status") == "purged") & (F.col("kind") == "message")).count()
        if deletes and not failed_batches:
            original(self, outcomes, query_id, batch_id, may_hold, began_ms)
            failed_batches.append(batch_id)
            failures.append(f"forced failure after the ledger write of batch {batch_id}")
            raise RuntimeError(failures[-1])
        if deletes and len(failed_batches) == 1 and batch_id != failed_batches[0]:
            failed_batches.append(batch_id)
            failures.append(f"forced failure before the ledger write of batch {batch_id}")
            raise RuntimeError(failures[-1])
        original(self, outcomes, query_id, batch_id, may_hold, began_ms)

    monkeypatch.setattr(Ledger, "append", failing_append)
    first = deletable(ops_platform, ops, 6, "retry-a")
    kept = kept_by_the_double_check(ops_platform, ops, "retry-kept")
    second: list[str] = []
    running, restarts = start_purger(spark, ops), 0
    try:
        def progressing() -> bool:
            nonlocal running, restarts
            if not running.query.isActive:  # a forced failure: restart from the checkpoint, as a supervisor would
                assert any(f in str(running.query.exception()) for f in failures), running.query.exception()
                running.stop()
                running, restarts = start_purger(spark, ops), restarts + 1
            if len(failures) == 1 and not second and all(ops_platform.row(m) is None for m in first):
                second.extend(deletable(ops_platform, ops, 6, "retry-b"))
            return bool(second) and len(failures) == 2 and all(
                ops_platform.row(m) is None and ops_platform.payload_gone(f"p-{m}") for m in first + second)

        wait_for(progressing, timeout_s=240, what="both forced failures and every deletion")
    finally:
        running.stop()
    assert restarts == 2, failures
    # Each failed batch's retry merged its records by their ids; its first attempt appended without a look.
    for batch in failed_batches:
        assert [may_hold for b, may_hold in appends if b == batch] == [False, True], appends

    ledger = Ledger(spark, ops.ledger)
    per_object = Counter((r["kind"], r["id"], r["dc"]) for r in purged(ledger).collect())
    expected = {("message", m, None) for m in first + second}
    expected |= {("payload_refs", key_id([f"p-{m}", m]), None) for m in first + second}
    expected |= {("payload", f"p-{m}", dc) for m in first + second for dc in (None, "dc1", "dc2")}
    assert set(per_object) == expected
    assert set(per_object.values()) == {1}, "a deletion recorded twice"
    # The deletions of the batch that failed before its ledger write are recorded by its retry.
    recovered = {r["id"] for r in purged(ledger).where(F.col("reason").startswith(EARLIER_ATTEMPT)).collect()}
    assert recovered & set(second)
    assert ops_platform.row(kept) is not None
    assert ledger.records().where((F.col("id") == kept) & (F.col("status") == "skipped")).count() >= 1

    # The cap: within each batch, message deletions are spaced so that no more than CAP go per second;
    # each of the (at most 2) tasks running at once starts with one.
    for batch in purged(ledger).where(F.col("kind") == "message").groupBy("batch_id").agg(
            F.count(F.lit(1)).alias("n"),
            (F.max("deleted_at").cast("double") - F.min("deleted_at").cast("double")).alias("span_s")).collect():
        if batch["n"] >= 3:
            assert batch["n"] - 2 <= CAP * batch["span_s"] * 1.1, batch


def test_the_daily_report_equals_counts_over_the_ledger(spark, ops):
    ledger, report = Ledger(spark, ops.ledger), Report(spark, ops.ledger, ops.policy_set)
    report.refresh()
    # The module's purges' day, if a midnight passed since.
    day = ledger.records().agg(F.max("date")).first()[0] or now().date()
    rows = {(r["kind"], r["dc"]): r for r in report.rows(day)}
    records = ledger.records().where(F.col("date") == F.lit(day)).collect()
    groups: dict[tuple[str, str], list] = {}
    for r in records:
        groups.setdefault((r["kind"], r["dc"] or "all"), []).append(r)
    assert set(rows) == set(groups) and ("message", "all") in rows and ("payload", "dc2") in rows
    for key, group in groups.items():
        row = rows[key]
        assert row["candidates"] == len(group)
        for status in STATUSES:
            assert row[status] == sum(r["status"] == status for r in group), (key, status)
        assert dict(row["skipped_by_reason"]) == dict(Counter(
            r["reason"].split(":")[0] for r in group if r["status"] == "skipped"))
        lags = [r["lag_s"] for r in group if r["status"] == "purged"]
        for p in LAG_PERCENTILES:
            assert ranked_within(lags, p, row[f"lag_p{int(p * 100)}_s"], row["lag_rank_error"]), (key, p)
        assert row["started_at"] == min(r["decided_at"] for r in group)
        assert row["finished_at"] == max(r["decided_at"] for r in group)
    assert rows[("message", "all")]["skipped_by_reason"] == {"live": 1}


def scrape(config: PurgerConfig) -> dict[str, float]:
    """The purger's Prometheus endpoint, as {sample name with labels: value}."""
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{config.metrics.port}/metrics", timeout=10).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in scraped.splitlines() if line and not line.startswith("#")}


def test_the_metrics_are_read_back_from_the_running_query(spark, ops, ops_platform):
    """The metrics, for every policy's kinds; and the cap on deletions holds for every policy's objects."""
    objects = PolicyObjects(ops)
    running = start_purger(spark, ops)
    try:
        messages = deletable(ops_platform, ops, 3, "metrics")
        written = [o for i in range(3) for o in objects.write(f"metrics-{uuid.uuid4().hex[:6]}-{i}")]
        objects.flush()
        wait_for(lambda: all(ops_platform.row(m) is None for m in messages)
                 and all(objects.gone(o) for o in written if o.eligible), what="the deletions")
        rows = Counter(kind for o in written if o.eligible for _, kind, _ in ledger_rows(o))
        wait_for(lambda: running.metrics.totals[("message", "purged")] >= 3
                 and all(running.metrics.totals[(kind, "purged")] >= n for kind, n in rows.items()),
                 what="the sink's batches to finish")
        samples = scrape(ops)
        assert samples['purger_outcomes_total{kind="message",status="purged"}'] >= 3
        for kind, n in rows.items():
            assert samples[f'purger_outcomes_total{{kind="{kind}",status="purged"}}'] == n, kind
        assert samples["purger_purge_lag_seconds_count"] >= 3
        assert "purger_deletions_per_second" in samples and "purger_processed_rows_per_second" in samples
        # The progress follower has read Spark's progress; the query's own observed metrics are in it.
        wait_for(lambda: scrape(ops)["purger_state_rows"] > 0, what="the follower's state rows")
        wait_for(lambda: observed(running.query, "message_candidates") >= 1, what="the observed candidates")
        wait_for(lambda: scrape(ops)['purger_candidates_total{kind="message"}'] >= 3,
                 what="every batch's candidates, each batch counted once")
        assert scrape(ops)["purger_query_active"] == 1
        assert running.query.name == ops.stream.query_name
        # Spark's own metrics of the query, for the same scraper, on the UI's port.
        spark_metrics = urllib.request.urlopen(f"{spark.sparkContext.uiWebUrl}/metrics/prometheus",
                                               timeout=10).read().decode()
        assert f"spark_streaming_{ops.stream.query_name}_inputRate" in spark_metrics.replace(".", "_")
    finally:
        running.stop()
        objects.close()
    assert running.metrics.registry.get_sample_value("purger_query_active") == 0
    # The cap, as in the forced-retries test, over every policy's candidates: users and units of work
    # included, each paced as one deletion however many rows go with it.
    candidates = purged(Ledger(spark, ops.ledger)).where(
        F.col("kind").isin("rule_event", "user", "unit_of_work") & F.col("reason").isNull())
    assert candidates.count() == 9
    for batch in candidates.groupBy("batch_id").agg(
            F.count(F.lit(1)).alias("n"),
            (F.max("deleted_at").cast("double") - F.min("deleted_at").cast("double")).alias("span_s")).collect():
        if batch["n"] >= 3:
            assert batch["n"] - 2 <= CAP * batch["span_s"] * 1.1, batch


def test_a_dry_run_records_would_delete_and_deletes_nothing(spark, config, tmp_path_factory):
    """Every policy: would_delete for each row a real run would delete, dependents included; nothing deleted.
    SPEC 9.5: all of it in the dry run's own ledger and report, none in the real purger's; a bad record on its
    own dead-letter topic, not on the real one."""
    every_policy = with_policies(config, {**config.policies, **SETTINGS})
    real = own_config(every_policy, tmp_path_factory.mktemp("dry"), "dry", report_interval=timedelta(seconds=2))
    dry = real.as_dry_run()
    create_topics(dry, partitions=2)  # its own control and dead-letter topics, as `purger setup` makes them
    platform, objects = Platform(dry), PolicyObjects(dry)
    try:
        messages = deletable(platform, dry, 4, "dry")
        live = f"dry-live-{uuid.uuid4().hex[:6]}"
        platform.enqueue(live, f"p-{live}", extract_count=2)
        bad = f"dry-bad-{uuid.uuid4().hex[:6]}".encode()
        platform.send([(bad, b"{not an event")])
        platform.flush()
        written = objects.write(f"dry-{uuid.uuid4().hex[:6]}")
        objects.flush()
        would_go = set().union(*(ledger_rows(o) for o in written if o.eligible))
        would_go |= {("mailbox", "payload_refs", key_id([f"p-{m}", m])) for m in messages}
        running = start_purger(spark, dry)
        ledger = Ledger(spark, dry.ledger)
        try:
            def decided() -> set[tuple[str, str, str]]:
                if not ledger.exists():
                    return set()
                return {(r["policy"], r["kind"], r["id"]) for r in
                        ledger.records().where(F.col("status") == "would_delete").collect()}
            wait_for(lambda: decided() >= {("mailbox", "message", m) for m in messages} | would_go,
                     what="would_delete for every eligible message and every row of the eligible objects")
            wait_for_watermark(running.query, now() + timedelta(seconds=1))
            wait_for(lambda: DeltaTable.isDeltaTable(spark, dry.ledger.report_path), 30, "the dry run's daily report")
        finally:
            running.stop()
        for m in messages + [live]:
            assert platform.row(m) is not None and platform.payload_intact(f"p-{m}"), m
        assert all(objects.intact(o) for o in written), "a dry run deleted a row"
        assert dry.ledger.path == f"{real.ledger.path}.dry-run"
        # Nothing of the dry run's at the real purger's paths, not even an empty table.
        assert not any(Path(p).exists() for p in (real.ledger.path, real.ledger.report_path))
        records = ledger.records().collect()
        assert {r["status"] for r in records} == {"would_delete", "dead_lettered"}
        decisions = [r for r in records if r["status"] == "would_delete"]
        assert {(r["policy"], r["kind"], r["id"]) for r in decisions if r["kind"] != "message"} == would_go
        assert all(f"payload p-{r['id']} would be released" in r["reason"] for r in decisions if r["kind"] == "message")
        assert ledger.records().where(F.col("id") == live).count() == 0
        assert len([r for r in records if r["status"] == "dead_lettered"]) == 1
        # The bad record, on the dry run's own dead-letter topic and not on the real one.
        assert topic_records(real, real.kafka.dead_letter_topic) == []
        assert topic_records(dry, dry.kafka.dead_letter_topic) == [(bad, b"{not an event")]
    finally:
        platform.close()
        objects.close()


def topic_records(config: PurgerConfig, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every record in ``topic`` up to its end offsets now, as (key, value)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap_servers, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        assert partitions, f"topic {topic} does not exist"
        ends = consumer.end_offsets(partitions)
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        found, deadline = [], time.monotonic() + 30
        while any(consumer.position(p) < end for p, end in ends.items()) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=1000).values():
                found += [(r.key, r.value) for r in batch if r.offset < ends[TopicPartition(r.topic, r.partition)]]
        return found
    finally:
        consumer.close()


def test_a_batch_that_reaches_a_closed_sink_deletes_nothing_and_runs_again(spark, config, tmp_path_factory):
    """The stop's gate: once ``stop`` has closed the sink, a batch that still reaches it is refused. The
    query ends, which is no failure; nothing was deleted and the next start purges the batch's objects."""
    own = own_config(config, tmp_path_factory.mktemp("closed"), "closed")
    platform = Platform(own)
    try:
        messages = deletable(platform, own, 2, "closed")
        running = start_purger(spark, own)
        try:
            running.sink.close(timeout_s=60)
            wait_for(lambda: not running.query.isActive, what="the query to end at the closed sink")
            # The query's end reaches its metrics before any stop (the alert that the purger is down reads it).
            wait_for(lambda: running.metrics.registry.get_sample_value("purger_query_active") == 0, 10,
                     "purger_query_active at 0 once the query ended")
        finally:
            running.stop()
        assert running.query.exception() is not None and running.failure is None
        assert all(platform.row(m) is not None and platform.payload_intact(f"p-{m}") for m in messages)
        again = start_purger(spark, own)
        try:
            wait_for(lambda: all(platform.row(m) is None and platform.payload_gone(f"p-{m}") for m in messages),
                     what="the refused batch's objects, at the next start")
        finally:
            again.stop()
        assert again.failure is None
    finally:
        platform.close()


def test_a_stop_is_prompt_and_a_batch_refused_at_it_is_no_failure(spark, config, tmp_path_factory):
    """A stop of a running purger, with the daily report rewritten every 2 s beside it, takes seconds, not the
    minute and a half a stop waited for an idle trigger; it deletes and records what it has begun. A batch that
    reaches the closed sink waits there for the stop, which ends the query as stopped, not failed. The jobs of
    each batch that purged are named in the Spark UI after the batch and the step (the purge, the ledger), the
    daily report's beside them."""
    own = own_config(config, tmp_path_factory.mktemp("stop"), "stop", report_interval=timedelta(seconds=2))
    platform = Platform(own)
    try:
        running = start_purger(spark, own)
        try:
            messages = deletable(platform, own, 2, "stop")
            wait_for(lambda: all(platform.row(m) is None for m in messages), what="the deletions")
            # Report rounds and clock ticks under way. Delta's jobs prefix the description with "Delta: ".
            wait_for(lambda: any("daily report" in job.get("description", "") for job in ui_jobs(spark)),
                     what="the daily report's jobs")
        finally:
            started = time.monotonic()
            clean = running.stop()
            took = time.monotonic() - started
        assert clean and running.stopped_cleanly and running.failure is None
        assert running.sink.last_batch is not None
        assert took < 15, f"the stop took {took:.1f} s"
        batches = {r["batch_id"] for r in Ledger(spark, own.ledger).records().select("batch_id").collect()}
        descriptions = {job.get("description", "") for job in ui_jobs(spark)}
        for batch in batches:
            for step in ("purge candidates", "ledger"):
                assert any(d.startswith(f"batch {batch}: {step}") for d in descriptions), (batch, step, descriptions)

        again = start_purger(spark, own)
        wait_for(lambda: again.sink.last_batch is not None, what="a batch of the second start")
        again.sink.close(timeout_s=60)
        time.sleep(3)  # a trigger or two: the next batch reaches the closed sink and waits there
        assert again.query.isActive
        again.stop()
        assert again.query.exception() is None  # a stop, not SinkClosed
    finally:
        platform.close()


def test_a_replay_from_earliest_reaches_the_same_end_state(spark, config, tmp_path_factory):
    """A history of its own (messages purged, one kept by the double-check; an object of each other built-in
    policy purged and one kept), purged by a first run, then replayed into a fresh checkpoint: the same rows
    and payloads remain, and the replay deletes nothing (what was eligible is gone already)."""
    every_policy = with_policies(config, {**config.policies, **SETTINGS})
    own = own_config(every_policy, tmp_path_factory.mktemp("replay"), "replay")
    platform, objects = Platform(own), PolicyObjects(own)
    sent: dict[str, bool] = {}
    try:
        first = start_purger(spark, own)
        try:
            deletable(platform, own, 6, "replay", sent)
            kept_by_the_double_check(platform, own, "replay-kept", sent)
            written = objects.write(f"replay-{uuid.uuid4().hex[:8]}")
            objects.flush()
            wait_for(lambda: all(platform.row(m) is None and platform.payload_gone(f"p-{m}")
                                 for m, stays in sent.items() if not stays)
                     and all(objects.gone(o) for o in written if o.eligible),
                     timeout_s=120, what="the first run to purge the history")
        finally:
            first.stop()
        assert first.failure is None
        before = {m: (platform.row(m) is not None, platform.payload_intact(f"p-{m}")) for m in sent}
        assert before == {m: (stays, stays) for m, stays in sent.items()}
        assert all(objects.intact(o) for o in written if not o.eligible)
        original = Ledger(spark, own.ledger).records().select("query_id").distinct().collect()
        purged_before = purged(Ledger(spark, own.ledger)).count()
        started = now()
        running, backlog = start_replay(spark, own, since_ms=None)
        try:
            assert backlog.total >= 2 * len(sent)
            follow(running.query, backlog, show=False, timeout_s=180)
            wait_for_watermark(running.query, started + timedelta(seconds=5), timeout_s=90)
            # Each purged object found gone: its deletion recorded again from its intent (the replay cannot
            # know whether the first run's batch reached the ledger), or already gone (a dependent's own).
            def revisited(kind):
                return running.sink.totals[(kind, "already_gone")] + running.sink.totals[(kind, "purged")]

            wait_for(lambda: revisited("payload") >= sum(not s for s in sent.values())
                     and all(revisited(o.kind) >= 1 for o in written if o.eligible),
                     timeout_s=90, what="the replay to revisit every purged payload and object")
        finally:
            running.stop()
        after = {m: (platform.row(m) is not None, platform.payload_intact(f"p-{m}")) for m in sent}
        assert after == before
        # The ledger keeps each deletion once: the replay's records from intents are the first run's.
        assert purged(Ledger(spark, own.ledger)).count() == purged_before
        assert all(objects.intact(o) for o in written if not o.eligible)
    finally:
        platform.close()
        objects.close()
    replay_records = Ledger(spark, own.ledger).records().where(
        ~F.col("query_id").isin([r["query_id"] for r in original]))
    assert replay_records.where(F.col("status") == "purged").count() == 0
    # The purged messages found gone: their deletions, recorded from the intents, are the first run's records.
    purged_messages = [m for m, stays in sent.items() if not stays]
    assert replay_records.where((F.col("kind") == "message") & F.col("id").isin(purged_messages)).count() == 0


def test_the_ledger_on_s3a_keeps_each_record_once_and_a_retrys_new_deletions(spark, config):
    """The ledger in an S3 bucket (s3a://), each record kept once by its id: a batch written again by its retry
    adds only what the retry newly decided (a row that became due meanwhile, a data centre that had failed),
    and a deletion recorded again from its intent by a later batch is the record already there."""
    store = config.stores["dc1"]
    s3 = S3Endpoint(endpoint=store.endpoint, access_key=store.access_key, secret_key=store.secret_key)
    prefix = f"s3a://{store.bucket}/ledger-test-{uuid.uuid4().hex[:8]}"
    ledger_config = config.ledger.model_copy(update={"path": f"{prefix}/records", "s3": s3})
    ledger = Ledger(spark, ledger_config)
    at = int(now().timestamp() * 1000)
    def outcomes(ids, batch, intent=None):
        return spark.createDataFrame(
            [("mailbox", "message", m, "deleted", None, "purged", None, at - 5000, at, at, batch, "host:1", intent)
             for m in ids], OUTCOME_SCHEMA)

    ledger.append(outcomes([f"m{i}" for i in range(5)], 3), "query-a", 3, may_hold=False)
    ledger.append(outcomes([f"m{i}" for i in range(6)], 3), "query-a", 3)  # its retry, which also deleted m5
    ledger.append(outcomes(["m0"], 9, intent="query-a/3"), "query-a", 9)  # m0 found gone by a later batch
    records = ledger.records().collect()
    assert sorted(r["id"] for r in records) == [f"m{i}" for i in range(6)]
    assert {r["batch_id"] for r in records if r["id"] == "m0"} == {3}
    assert {r["lag_s"] for r in records} == {5.0}
    report = Report(spark, ledger_config.model_copy(update={"report_path": f"{prefix}/report"}), config.policy_set)
    report.refresh()
    [row] = report.rows(datetime.fromtimestamp(at / 1000, timezone.utc).date())  # the records' day, past midnight too
    assert (row["kind"], row["dc"], row["candidates"], row["purged"]) == ("message", "all", 6, 6)
