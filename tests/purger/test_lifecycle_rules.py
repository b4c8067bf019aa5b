"""Which lifecycle rules `purger setup` takes as expiring the noncurrent versions of a policy's blobs
(``stores.<dc>.noncurrent_versions = "lifecycle"``; docs/operations.md, "Versioned buckets"): the rules as
``GetBucketLifecycleConfiguration`` returns them."""

import pytest

from purger.setup import expires_noncurrent_versions

EXPIRES = {"NoncurrentVersionExpiration": {"NoncurrentDays": 7}}


@pytest.mark.parametrize("rule, covers", [
    ({"Status": "Enabled", "Filter": {"Prefix": "payloads/"}, **EXPIRES}, True),
    ({"Status": "Enabled", "Filter": {"Prefix": ""}, **EXPIRES}, True),
    ({"Status": "Enabled", "Filter": {}, **EXPIRES}, True),  # the whole bucket
    ({"Status": "Enabled", "Prefix": "pay", **EXPIRES}, True),  # the older form, a prefix beside the rule
    ({"Status": "Disabled", "Filter": {"Prefix": "payloads/"}, **EXPIRES}, False),
    ({"Status": "Enabled", "Filter": {"Prefix": "payloads/"}, "Expiration": {"Days": 30}}, False),
    ({"Status": "Enabled", "Filter": {"Prefix": "payloads/2026/"}, **EXPIRES}, False),  # narrower than the blobs'
    ({"Status": "Enabled", "Filter": {"Tag": {"Key": "k", "Value": "v"}}, **EXPIRES}, False),  # only tagged keys
    ({"Status": "Enabled", "Filter": {"And": {"Prefix": "payloads/", "Tags": [{"Key": "k", "Value": "v"}]}},
      **EXPIRES}, False),
])
def test_a_rule_covers_a_prefix_only_when_enabled_expiring_noncurrent_versions_of_every_key_under_it(rule, covers):
    assert expires_noncurrent_versions(rule, "payloads/") is covers
