"""Blobs in buckets that keep versions (SPEC 11.4; docs/operations.md, "Versioned buckets"), on SeaweedFS: a
delete there only adds a delete marker over the key's versions. The purge of a payload removes every version of its
blob (``stores.<dc>.noncurrent_versions = "delete"``) or leaves them to the bucket's lifecycle rule
(``"lifecycle"``), and its ledger record says which; `purger setup` says whether each store versions, and refuses
``lifecycle`` without a rule that expires the noncurrent versions. The oracle is the store's own listing of the
key's versions against the uploads the test made."""

from __future__ import annotations

import pytest

from purger.connectors import s3_client
from purger.core.vocabulary import BY_LIFECYCLE, EVERY_VERSION, PURGED, category
from purger.policies.mailbox.deletes import payload_key
from purger.policies.mailbox.rules import PAYLOAD
from simulation.mailbox import Platform
from tests.integration.versioned.conftest import LIFECYCLE_RULE
from tests.support.mailbox import candidate, purge, unreferenced_payload

pytestmark = pytest.mark.integration

UPLOADS = 3  # versions of each blob: the platform's upload, then two more


@pytest.fixture(scope="module")
def platform(versioned_config):
    platform = Platform(versioned_config)
    yield platform
    platform.close()


def versions(config, dc: str, key: str) -> tuple[list[bool], list[bool]]:
    """The key's versions and its delete markers in ``dc``'s bucket, each as whether it is the current one."""
    listed = s3_client(config.stores[dc]).list_object_versions(Bucket=config.stores[dc].bucket, Prefix=key)
    return ([v["IsLatest"] for v in listed.get("Versions", []) if v["Key"] == key],
            [m["IsLatest"] for m in listed.get("DeleteMarkers", []) if m["Key"] == key])


def test_a_payloads_purge_removes_every_version_or_leaves_them_to_the_lifecycle_rule_and_says_which(
        versioned_config, platform):
    p = unreferenced_payload(platform, versioned_config)
    key = payload_key(p)
    for dc, store in versioned_config.stores.items():
        for n in range(UPLOADS - 1):
            s3_client(store).put_object(Bucket=store.bucket, Key=key, Body=f"version {n + 2}".encode())
        assert len(versions(versioned_config, dc, key)[0]) == UPLOADS

    records = {r["dc"]: r for r in purge(versioned_config, candidate("payload", p, PAYLOAD))}

    assert {dc: r["status"] for dc, r in records.items()} == {"dc1": PURGED, "dc2": PURGED, None: PURGED}
    # dc1: every version and the delete marker gone, nothing billed.
    assert versions(versioned_config, "dc1", key) == ([], [])
    assert category(records["dc1"]["reason"]) == EVERY_VERSION
    assert records["dc1"]["reason"].startswith(f"{EVERY_VERSION}: {UPLOADS + 1} versions")
    # dc2: the delete marker current, the versions noncurrent, the lifecycle rule's to expire.
    assert versions(versioned_config, "dc2", key) == ([False] * UPLOADS, [True])
    assert category(records["dc2"]["reason"]) == BY_LIFECYCLE
    assert not platform.blob_exists(p, "dc1") and not platform.blob_exists(p, "dc2")


def test_setup_says_whether_each_store_versions_and_refuses_lifecycle_without_a_rule(versioned_config):
    from purger.setup import set_up

    found = set_up(versioned_config, create=False)
    [line] = [line for line in found.checked if versioned_config.stores["dc1"].bucket in line]
    assert "(stores.dc1, versioning on: a purge deletes every version of a blob)" in line
    assert f"(stores.dc2, versioning on: noncurrent versions left to lifecycle rule {LIFECYCLE_RULE})" in line
    assert not [problem for problem in found.problems if "stores.dc" in problem]

    # dc2's bucket without its rule: refused, in a line naming the bucket, the setting and what to do.
    dc2 = versioned_config.stores["dc2"]
    s3_client(dc2).delete_bucket_lifecycle(Bucket=dc2.bucket)
    try:
        [problem] = [problem for problem in set_up(versioned_config, create=False).problems if "stores.dc2" in problem]
        assert dc2.bucket in problem and "stores.dc2.noncurrent_versions" in problem and "payloads/" in problem
        assert "NoncurrentVersionExpiration" in problem
    finally:
        s3_client(dc2).put_bucket_lifecycle_configuration(Bucket=dc2.bucket, LifecycleConfiguration={
            "Rules": [{"ID": LIFECYCLE_RULE, "Status": "Enabled", "Filter": {"Prefix": "payloads/"},
                       "NoncurrentVersionExpiration": {"NoncurrentDays": 1}}]})


def test_an_orphan_blob_in_a_versioned_bucket_goes_with_every_version(versioned_config):
    """A blob without its payload row, older than the grace, swept by a reconcile's decision (``decide``): every
    version of it gone from dc1's bucket, as for a payload's purge."""
    import time
    import uuid

    from purger.core.times import duration_ms, epoch_ms, now_ms
    from purger.reconcile.orphan_purges import Sweep, decide, ledger_query_id

    policy = versioned_config.policy_set.policy_of("payload")
    [blobs] = policy.blobs
    store = versioned_config.stores["dc1"]
    orphan = f"orphan-{uuid.uuid4().hex[:8]}"
    for n in range(UPLOADS):
        s3_client(store).put_object(Bucket=store.bucket, Key=blobs.prefix + orphan, Body=f"version {n}".encode())
    grace_ms = duration_ms(versioned_config.reconcile.orphan_grace)
    time.sleep(grace_ms / 1000 + 1)
    modified = epoch_ms(s3_client(store).head_object(Bucket=store.bucket, Key=blobs.prefix + orphan)["LastModified"])
    sweep = Sweep(policy.name, blobs, policy.table_names()[blobs.table], "dc1", grace_ms, now_ms() - grace_ms, False,
                  ledger_query_id(uuid.uuid4().hex[:12], policy.name, blobs.table, "dc1"))

    decided = decide(versioned_config, sweep, orphan, modified, None)

    assert (decided[5], category(decided[6])) == (PURGED, EVERY_VERSION), decided
    assert versions(versioned_config, "dc1", blobs.prefix + orphan) == ([], [])


def test_the_shards_list_every_version_under_the_prefix_exactly_once_and_the_reconcile_counts_the_noncurrent(
        spark, versioned_config):
    """Keys beginning with characters of a shard and of the catch-all, two versions each, every other one
    deleted (a delete marker over them), and keys outside the prefix: each version and delete marker listed
    once by the shards together, at any page size; the reconcile's count of noncurrent versions and their
    bytes is the store's own listing's."""
    from purger.reconcile.orphan_listing import list_versions_shard, noncurrent_versions

    store = versioned_config.stores["dc1"]
    client, prefix = s3_client(store), "listing/"
    firsts = ["0", "9", "A", "a", "aa", "b", "z", "-", "_", "~", "é", "中"]
    inside = [prefix + f"{first}{n}" for first in firsts for n in range(2)]
    for number, key in enumerate(inside + ["other/a1", "listingX/a1"]):
        for version in range(2):
            client.put_object(Bucket=store.bucket, Key=key, Body=b"x" * (10 + version))
        if number % 2:
            client.delete_object(Bucket=store.bucket, Key=key)
    everything = client.list_object_versions(Bucket=store.bucket, Prefix=prefix)
    expected = sorted((item["Key"], item["VersionId"]) for item in everything.get("Versions", [])
                      + everything.get("DeleteMarkers", []))
    assert len(expected) == 2 * len(inside) + len(inside) // 2
    shards = "0Aab9"
    for page_size in (1000, 2, 1):  # small pages: the catch-all's jumps over the shards' keys are exercised
        seen = sorted((item["Key"], item["VersionId"]) for first in [*shards, None]
                      for item in list_versions_shard(client, store.bucket, prefix, first, shards, page_size))
        assert seen == expected, page_size

    noncurrent = [item for item in everything.get("Versions", []) if not item["IsLatest"]]
    assert noncurrent_versions(spark, versioned_config, prefix, "dc1") == (
        len(noncurrent), sum(item["Size"] for item in noncurrent))
    assert len(noncurrent) == len(inside) + len(inside) // 2


def test_setup_adds_the_undo_windows_rule_beside_the_buckets_own_once(versioned_config):
    """SPEC 11.2 on a store with lifecycle rules: `purger setup` with a 7-day undo window adds
    `purger-undo-window` (the copies' prefix, expired a day after the window) to dc2's bucket, keeping the
    bucket's own rule as it was; run again, it finds the rule in place and creates nothing. Read back from the
    bucket."""
    from datetime import timedelta

    from purger.setup import UNDO_RULE, Findings, _undo_copies

    undo = versioned_config.model_copy(update={"undo": versioned_config.undo.model_copy(
        update={"window": timedelta(days=7)})})
    dc2 = undo.stores["dc2"]
    client = s3_client(dc2)
    own = client.get_bucket_lifecycle_configuration(Bucket=dc2.bucket)["Rules"]
    try:
        first, again = Findings(), Findings()
        assert _undo_copies(client, undo, "dc2", first) == f"; undo copies expired by lifecycle rule {UNDO_RULE}"
        assert first.created == [f"lifecycle rule {UNDO_RULE} on bucket {dc2.bucket} (stores.dc2): expires "
                                 f"{undo.undo.prefix} after 8 days (undo.window)"]
        rules = {rule["ID"]: rule for rule in client.get_bucket_lifecycle_configuration(Bucket=dc2.bucket)["Rules"]}
        assert set(rules) == {LIFECYCLE_RULE, UNDO_RULE}
        assert rules[UNDO_RULE]["Expiration"]["Days"] == 8
        assert rules[UNDO_RULE]["Filter"] == {"Prefix": undo.undo.prefix}
        assert [rules[LIFECYCLE_RULE]] == [rule for rule in own if rule["ID"] == LIFECYCLE_RULE]
        assert _undo_copies(client, undo, "dc2", again) == f"; undo copies expired by lifecycle rule {UNDO_RULE}"
        assert again.created == []
    finally:
        client.put_bucket_lifecycle_configuration(Bucket=dc2.bucket, LifecycleConfiguration={"Rules": own})
