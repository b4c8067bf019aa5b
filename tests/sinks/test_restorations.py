"""The undo window's edges on the real servers (``purger.sinks.restorations``, ``purger.restore``, ``purger setup``):
the blobs' copies past the window deleted by whole days, each bucket's lifecycle rule or the word that the upkeep
expires them, and a deletion past the window recorded as not restored."""

from __future__ import annotations

import uuid
from datetime import date, timedelta

from purger.connectors import s3_client


def with_window(config):
    """The configuration with an undo window of a day."""
    return config.model_copy(update={"undo": config.undo.model_copy(update={"window": timedelta(days=1)})})


def test_the_copies_past_the_window_go_by_whole_days_and_nothing_else_under_the_prefix(config):
    """Copies kept on a day before the window: deleted in every data centre's bucket; today's, and a folder under
    the prefix that is no day, stay. Read back from the buckets."""
    undo = with_window(config)
    run = uuid.uuid4().hex[:8]
    prefix = undo.undo.prefix
    old, today = f"{prefix}2020-01-0{1 + int(run[0], 16) % 9}/payloads/{run}", f"{prefix}{date.today()}/payloads/{run}"
    other = f"{prefix}not-a-day/{run}"
    clients = {dc: (s3_client(store), store.bucket) for dc, store in undo.stores.items()}
    for client, bucket in clients.values():
        for key in (old, today, other):
            client.put_object(Bucket=bucket, Key=key, Body=b"copy")
    try:
        from purger.sinks.restorations import expire_copies

        assert expire_copies(undo, date.today()) >= len(clients)
        for client, bucket in clients.values():
            keys = {item["Key"] for item in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}
            assert old not in keys and {today, other} <= keys
        assert expire_copies(config, date.today()) == 0  # no window: nothing looked at
    finally:
        for client, bucket in clients.values():
            for key in (old, today, other):
                client.delete_object(Bucket=bucket, Key=key)


def test_setup_says_how_each_buckets_copies_expire_and_a_rule_it_adds_is_there(config):
    """`purger setup` with an undo window: a store with lifecycle rules gets the rule (read back from the bucket,
    beside none of its others lost); one without says that the upkeep expires the copies."""
    from purger.setup import UNDO_RULE, Findings, _undo_copies

    undo = with_window(config)
    for dc, store in undo.stores.items():
        client, findings = s3_client(store), Findings()
        said = _undo_copies(client, undo, dc, findings)
        if said == f"; undo copies expired by lifecycle rule {UNDO_RULE}":
            rules = client.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]
            [rule] = [rule for rule in rules if rule["ID"] == UNDO_RULE]
            assert rule["Expiration"]["Days"] == 2 and rule["Filter"] == {"Prefix": undo.undo.prefix}
        else:
            assert said == "; no lifecycle rules: the purger's daily upkeep expires the undo copies"
            assert findings.created == []
        assert _undo_copies(client, config, dc, Findings()) == ""  # no window: the bucket is not looked at


def test_a_deletion_past_the_window_is_recorded_not_restored_and_nothing_is_held(spark, config):
    """A `purged` record with no image (kept before the window began, or never): the restore puts nothing back,
    holds nothing, and records it `not_restored` with why, once, in the ledger."""
    from pyspark.sql import functions as F

    from purger.core.times import now_ms
    from purger.restore import PAST_WINDOW, Deletion, new_run, restore
    from purger.sinks.ledger import Ledger

    run, gone = new_run(), f"gone-{uuid.uuid4().hex[:8]}"
    deletion = Deletion("message", gone, None, "expired_by_date", now_ms() - 60_000, None)
    done = restore(spark, config, "mailbox", [deletion], run, "test", "past the window")
    assert done.restored == [] and done.held == [] and done.not_restored == [(deletion, PAST_WINDOW)]
    records = Ledger(spark, config.ledger).records().where(F.col("id") == gone).collect()
    assert [(r.status, r.reason, r.query_id) for r in records] == [
        ("not_restored", PAST_WINDOW, f"restore/{run}")]


def test_a_restore_from_a_pseudonymised_ledger_finds_each_deletion_by_its_hash(spark, config, platform, tmp_path):
    """SPEC 11.2 with 11.3: a message purged with an undo window into a pseudonymised ledger (ids as keyed hashes,
    nothing in clear); a restore of it by its id matches its records by hashing the images' ids, puts its row and
    its reference back as Cassandra returned them before, and records each `restored` under the hash."""
    from pydantic import SecretStr
    from pyspark.sql import functions as F

    from purger.core.holds import Scope
    from purger.core.pseudonyms import Pseudonyms
    from purger.core.times import now_ms
    from purger.holds import release_hold
    from purger.policies.mailbox.rules import EXPIRED_BY_COUNTER
    from purger.restore import new_run, plan_restore, restore
    from purger.sinks.ledger import Ledger
    from purger.sinks.purge import OUTCOME_SCHEMA, purge_partition, to_ledger
    from tests.support.configs import mailbox
    from tests.support.mailbox import candidate, new_id
    from tests.support.waits import ago

    undo = with_window(config).model_copy(update={"ledger": config.ledger.model_copy(update={
        "path": str(tmp_path / "records"), "report_path": str(tmp_path / "report"), "pseudonymise": True,
        "pseudonym_key": SecretStr(f"key-{uuid.uuid4().hex}")})})
    r, m, p = mailbox(config), new_id("msg"), new_id("pay")
    platform.enqueue(m, p, at=ago(r.expired_ttl))
    platform.dequeue(m, 0, at=ago(r.expired_ttl))

    def stored() -> tuple:
        return tuple(platform.session.execute(f"SELECT JSON * FROM {table} WHERE {where}", key).one()
                     for table, where, key in (("messages", "message_id = %s", (m,)),
                                               (r.payload_refs_table, "payload_id = %s AND message_id = %s", (p, m))))

    before, began = stored(), now_ms() - 1_000
    assert None not in before
    ledger = Ledger(spark, undo.ledger)
    ledger.create()
    query = new_id("query")  # a stream's query id: names no object
    outcomes = to_ledger(purge_partition([candidate("message", m, EXPIRED_BY_COUNTER, payload_id=p)], undo,
                                         batch_id=0, query_id=query))
    ledger.append(spark.createDataFrame(outcomes, OUTCOME_SCHEMA), query, 0)
    assert stored() == (None, None)
    hashed = Pseudonyms.of(undo.ledger).id(m)
    assert {row.id for row in ledger.records().where(F.col("status") == "purged").collect()} >= {hashed}
    assert m.encode() not in b"".join(path.read_bytes() for path in tmp_path.rglob("*.parquet"))

    plan = plan_restore(spark, undo, "mailbox", began, now_ms(), ids=[m])
    assert sorted(d.kind for d in plan) == ["message", "payload_refs"] and all(d.image for d in plan)
    run = new_run()
    done = restore(spark, undo, "mailbox", plan, run, "test", "a pseudonymised restore")
    assert done.not_restored == [] and done.held == [f"message:{m}"]
    assert stored() == before
    records = ledger.records().where(F.col("query_id") == f"restore/{run}").collect()
    assert sorted((rec.kind, rec.status) for rec in records) == [("message", "restored"), ("payload_refs", "restored")]
    assert hashed in {rec.id for rec in records}
    release_hold(undo, Scope("message", m))
