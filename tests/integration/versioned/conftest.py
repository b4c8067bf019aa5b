"""SeaweedFS (``devstack.seaweedfs``), an S3 server that keeps versions, started for this package's tests beside the
local stack and stopped after its last: about 5 s to start (its first build, with Go, about 5 minutes), 1 s to
stop. Two buckets with versioning on: dc1's purged by deleting every version, dc2's left to its lifecycle rule."""

import uuid

import pytest

LIFECYCLE_RULE = "expire-noncurrent-payloads"


@pytest.fixture(scope="package")
def versioned_store(servers):
    from devstack.seaweedfs import VersionedStore

    store = VersionedStore(log=lambda _: None)
    store.up()
    yield store
    store.down()


@pytest.fixture(scope="package")
def versioned_config(config, versioned_store):
    """The suite's configuration with the object stores SeaweedFS's: dc1's bucket with
    ``noncurrent_versions = "delete"``, dc2's with ``"lifecycle"`` and a rule that expires the noncurrent versions
    under ``payloads/``; both versioned."""
    from purger.connectors import s3_client

    run = uuid.uuid4().hex[:8]
    endpoint = versioned_store.endpoint().model_dump()
    stores = {"dc1": config.stores["dc1"].model_validate({**endpoint, "bucket": f"versioned-{run}-dc1"}),
              "dc2": config.stores["dc2"].model_validate({**endpoint, "bucket": f"versioned-{run}-dc2",
                                                          "noncurrent_versions": "lifecycle"})}
    for store in stores.values():
        client = s3_client(store)
        client.create_bucket(Bucket=store.bucket)
        client.put_bucket_versioning(Bucket=store.bucket, VersioningConfiguration={"Status": "Enabled"})
    s3_client(stores["dc2"]).put_bucket_lifecycle_configuration(Bucket=stores["dc2"].bucket, LifecycleConfiguration={
        "Rules": [{"ID": LIFECYCLE_RULE, "Status": "Enabled", "Filter": {"Prefix": "payloads/"},
                   "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
                   "Expiration": {"ExpiredObjectDeleteMarker": True}}]})
    return config.model_copy(update={"stores": stores})
