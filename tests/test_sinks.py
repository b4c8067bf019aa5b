"""The delete path against the real Cassandra and S3 endpoints, without the stream."""

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from purger.connections import cassandra_session
from sinks.cassandra import ALREADY_GONE, PURGED, SKIPPED, MessageDeleter
from sinks.objects import PayloadStores
from streams.rules import EXPIRED_BY_COUNTER

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def deleter(config):
    session = cassandra_session(config.cassandra)
    yield MessageDeleter(session, config.cassandra, config.retention)
    session.cluster.shutdown()


def long_ago(config):
    return datetime.now(timezone.utc) - config.retention.expired_ttl - timedelta(seconds=5)


def test_an_expired_row_is_deleted_once(platform, deleter, config):
    m = f"sink-{uuid.uuid4()}"
    platform.enqueue(m, f"p-{m}", at=long_ago(config))
    platform.dequeue(m, 0, at=long_ago(config))
    assert deleter.delete(m, EXPIRED_BY_COUNTER).status == PURGED
    assert platform.row(m) is None
    # A retried batch finds the row gone and says so, rather than skipping it.
    assert deleter.delete(m, EXPIRED_BY_COUNTER).status == ALREADY_GONE


def test_a_revived_row_is_kept(platform, deleter, config):
    m = f"sink-{uuid.uuid4()}"
    platform.enqueue(m, f"p-{m}", at=long_ago(config))
    platform.dequeue(m, 0, at=long_ago(config))
    platform.set_counter(m, 3)  # lands after the stream decided, before the delete
    outcome = deleter.delete(m, EXPIRED_BY_COUNTER)
    assert (outcome.status, outcome.reason) == (SKIPPED, "revived: extract_count is 3")
    assert platform.row(m)["extract_count"] == 3


def test_a_row_not_yet_due_by_the_wall_clock_is_kept(platform, deleter):
    m = f"sink-{uuid.uuid4()}"
    platform.enqueue(m, f"p-{m}")
    platform.dequeue(m, 0)  # zero just now: expired_ttl has not passed
    outcome = deleter.delete(m, EXPIRED_BY_COUNTER)
    assert outcome.status == SKIPPED and outcome.reason.startswith("not yet due")
    assert platform.row(m) is not None


def test_payload_blobs_go_from_every_data_centre(platform, config):
    m = f"sink-{uuid.uuid4()}"
    platform.enqueue(m, f"p-{m}", dcs=("dc1", "dc2"))
    assert platform.blob_exists(f"p-{m}", "dc1") and platform.blob_exists(f"p-{m}", "dc2")
    stores = PayloadStores(config.stores)
    assert stores.delete(f"p-{m}", ["dc1", "dc2"]) == {"dc1": None, "dc2": None}
    assert not platform.blob_exists(f"p-{m}", "dc1") and not platform.blob_exists(f"p-{m}", "dc2")
    # Deleting again is harmless; an unknown data centre is reported, not raised.
    errors = stores.delete(f"p-{m}", ["dc1", "dc9"])
    assert errors["dc1"] is None and "dc9" in errors["dc9"]
