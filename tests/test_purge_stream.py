"""The whole job on the real servers: events through Kafka, the stateful stage, deletes in Cassandra and S3."""

import time
import uuid
from datetime import datetime, timezone

import pytest

from streams.query import start_purger

pytestmark = pytest.mark.integration


def wait_for(condition, timeout_s=180, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def watermark_ms(query) -> int:
    progress = query.lastProgress
    stamp = progress and progress["eventTime"].get("watermark")
    return int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000) if stamp else 0


@pytest.fixture(scope="module")
def purger(spark, config):
    running = start_purger(spark, config)
    yield running
    running.stop()


def test_expired_messages_are_purged_and_revived_ones_kept(purger, platform, config):
    run = uuid.uuid4().hex[:8]
    expired, revived, inline, live = (f"{run}-{name}" for name in ("expired", "revived", "inline", "live"))
    for message in (expired, revived, live):
        platform.enqueue(message, f"p-{message}", extract_count=2, dcs=("dc1", "dc2"))
    platform.enqueue(inline, f"p-{inline}", extract_count=1, size=100)
    platform.dequeue(live, 1)
    zero_at = datetime.now(timezone.utc)
    for message in (expired, revived, inline):
        platform.dequeue(message, 0, at=zero_at)
    platform.flush()
    time.sleep(1)
    platform.set_counter(revived, 1)  # well before its deadline (expired_ttl after zero_at)
    platform.flush()

    wait_for(lambda: platform.row(expired) is None and platform.row(inline) is None,
             what="the expired messages' rows to be deleted")
    wait_for(lambda: not platform.blob_exists(f"p-{expired}", "dc1") and not platform.blob_exists(f"p-{expired}", "dc2"),
             timeout_s=30, what="the expired message's blobs to be deleted")

    # Let the watermark pass the deadline the revived message would have had.
    revived_deadline_ms = zero_at.timestamp() * 1000 + config.retention.expired_ttl.total_seconds() * 1000
    wait_for(lambda: watermark_ms(purger.query) > revived_deadline_ms + 2000, timeout_s=60,
             what="the watermark to pass the revived message's old deadline")
    row = platform.row(revived)
    assert row is not None and row["extract_count"] == 1
    assert platform.blob_exists(f"p-{revived}", "dc1") and platform.blob_exists(f"p-{revived}", "dc2")
    assert platform.row(live)["extract_count"] == 1
    assert platform.blob_exists(f"p-{live}", "dc1")
    assert purger.sink.totals[("message", "purged")] >= 2
    assert purger.sink.totals[("payload", "purged")] >= 2  # one blob in each of two data centres
    assert purger.query.exception() is None
