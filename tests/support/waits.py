"""Waiting on the running query and on time: the watermark, observed metrics, the Spark UI's jobs, a condition."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import datetime, timedelta, timezone


def wait_for(condition, timeout_s=120, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def watermark_ms(query) -> int:
    progress = query.lastProgress
    stamp = progress and progress["eventTime"].get("watermark")
    return int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000) if stamp else 0


def wait_for_watermark(query, moment: datetime, timeout_s=60):
    wait_for(lambda: watermark_ms(query) > moment.timestamp() * 1000, timeout_s,
             what=f"the watermark to pass {moment.isoformat()}")


def rows_dropped_as_late(query) -> int:
    return sum(op.get("numRowsDroppedByWatermark", 0) for p in query.recentProgress for op in p["stateOperators"])


def observed(query, name: str) -> int:
    """One of the query's observed metrics, summed over its recent progress. A batch's progress is
    posted after its sink returns, so wait for it rather than read it once."""
    return sum(p.observedMetrics["purger"][name] for p in query.recentProgress if "purger" in p.observedMetrics)


def now():
    return datetime.now(timezone.utc)


def ago(period: timedelta) -> datetime:
    return now() - period - timedelta(seconds=2)


def ui_jobs(spark) -> list[dict]:
    """The jobs of this session, from the Spark UI's REST API."""
    url = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/jobs"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)
