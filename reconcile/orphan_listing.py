"""Orphan blobs, step 1 (``reconcile.orphans``): a data centre's bucket listed under a policy's prefix in Spark
tasks, split by the first character after the prefix: a shard per letter and digit (``ListObjectsV2`` with
``Prefix=<prefix><c>``) and a catch-all for every other first character (``list_shard``), so each key under the
prefix is listed exactly once and no key outside it at all. Blobs younger than the grace are dropped at once.

Example::

    listed = spark.sparkContext.accumulator(0)
    blobs = listed_blobs(spark, config, "payloads/", "dc1", cutoff_ms, listed)   # id, last_modified_ms, etag
    [item["Key"] for item in list_shard(client, "dc1", "payloads/", "a")]        # every key under payloads/a
"""

from __future__ import annotations

import string
from functools import partial
from typing import Any, Callable, Iterable, Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from purger.core.settings import PurgerConfig
from purger.core.times import epoch_ms
from purger.sinks.clients import executor_store
from purger.sinks.objects import bucket_versioning

# The first characters after the prefix that have a listing of their own; every other one (and a key that
# is the prefix itself) goes to the catch-all.
SHARD_CHARACTERS = string.digits + string.ascii_uppercase + string.ascii_lowercase
# Above every character: <prefix><c><MAX_CHARACTER> comes after nearly every key under <prefix><c>
# (code-point order is S3's UTF-8 byte order).
MAX_CHARACTER = "\U0010ffff"

_LISTED = StructType([StructField("id", StringType(), False), StructField("last_modified_ms", LongType(), False),
                      StructField("etag", StringType())])


def list_shard(client: Any, bucket: str, prefix: str, first: str | None, shards: str = SHARD_CHARACTERS,
               page_size: int = 1000) -> Iterator[dict[str, Any]]:
    """The listing's items of one shard: every key under ``prefix + first``, or (``first`` None, the
    catch-all) every key under ``prefix`` whose first character after it is not one of ``shards``. The
    catch-all skips over the shards' keys and filters what it still meets of them, so the shards together
    list each key under the prefix exactly once. ``page_size``: keys per request.

    Pages follow one another by ``StartAfter`` (the page's last key), not by continuation tokens: some
    S3-compatible stores (s3proxy) hand back a token they then misread for a key outside the Basic
    Multilingual Plane, and the listing would start over for ever."""
    return _walk(prefix, first, shards, partial(_objects_page, client, bucket, page_size))


def list_versions_shard(client: Any, bucket: str, prefix: str, first: str | None, shards: str = SHARD_CHARACTERS,
                        page_size: int = 1000) -> Iterator[dict[str, Any]]:
    """The versions and delete markers of one shard's keys (``ListObjectVersions``), as ``list_shard`` lists the
    keys: in a bucket that keeps versions, what deletes left behind."""
    return _walk(prefix, first, shards, partial(_versions_page, client, bucket, page_size))


# A page of a listing: its items, the marker of the page after it (None: it was the last) and its last key.
Page = tuple[list[dict[str, Any]], Any, str | None]


def _walk(prefix: str, first: str | None, shards: str, page: Callable[[str, Any], Page]) -> Iterator[dict[str, Any]]:
    """A shard's items, page after page: ``page(listed prefix, marker)``, the marker None for the first, a key
    to list after, or the store's own marker of the page after."""
    listed_prefix = prefix if first is None else prefix + first
    marker: Any = None
    jumped: set[str] = set()
    while True:
        items, following, last = page(listed_prefix, marker)
        if first is not None:
            yield from items
        else:
            yield from (item for item in items if item["Key"] == prefix
                        or item["Key"][len(prefix):len(prefix) + 1] not in shards)
        if following is None:
            return
        character = last[len(prefix):len(prefix) + 1]
        if first is None and character and character in shards:
            # Among a shard's keys: jump past (nearly) all of them, once per shard; after that on from the
            # last key, so the listing always moves on in the store's own order (s3proxy's is UTF-16's,
            # not UTF-8's: keys with a character from U+E000 to U+FFFF come after the jump).
            jump = prefix + character + MAX_CHARACTER
            if jump > last and jump not in jumped:
                jumped.add(jump)
                following = jump
        marker = following


def _objects_page(client: Any, bucket: str, page_size: int, listed_prefix: str, after: str | None) -> Page:
    page = client.list_objects_v2(Bucket=bucket, Prefix=listed_prefix, MaxKeys=page_size,
                                  **({"StartAfter": after} if after is not None else {}))
    items = page.get("Contents", [])
    if not page.get("IsTruncated") or not items:
        return items, None, None
    last = items[-1]["Key"]
    if last == after:
        raise RuntimeError(f"the listing of {bucket}/{listed_prefix} does not move on past {last!r}")
    return items, last, last


def _versions_page(client: Any, bucket: str, page_size: int, listed_prefix: str, marker: Any) -> Page:
    """A page of versions: after ``marker``, a key (all its versions passed) or the store's (key, version id)."""
    markers = ({} if marker is None else {"KeyMarker": marker} if isinstance(marker, str)
               else {"KeyMarker": marker[0], "VersionIdMarker": marker[1]})
    page = client.list_object_versions(Bucket=bucket, Prefix=listed_prefix, MaxKeys=page_size, **markers)
    items = page.get("Versions", []) + page.get("DeleteMarkers", [])
    if not page.get("IsTruncated"):
        return items, None, None
    last = page["NextKeyMarker"]
    following = (last, page["NextVersionIdMarker"]) if page.get("NextVersionIdMarker") else last
    if following == marker:
        raise RuntimeError(f"the listing of the versions of {bucket}/{listed_prefix} does not move on past {last!r}")
    return items, following, last


def noncurrent_versions(spark: SparkSession, config: PurgerConfig, prefix: str, dc: str) -> tuple[int, int]:
    """The noncurrent versions under ``prefix`` in ``dc``'s bucket and their bytes (delete markers hold none),
    listed in Spark tasks by the same shards as the keys; (0, 0) with no listing when the bucket keeps no
    versions."""
    if bucket_versioning(executor_store(config, dc), config.stores[dc].bucket) is None:
        return 0, 0
    shards: list[str | None] = [*SHARD_CHARACTERS, None]
    tasks = min(len(shards), spark.sparkContext.defaultParallelism * 4)
    counted = spark.sparkContext.parallelize(shards, tasks).mapPartitions(
        partial(_count_task, config, prefix, dc)).collect()
    return sum(count for count, _ in counted), sum(size for _, size in counted)


def _count_task(config: PurgerConfig, prefix: str, dc: str, shards: Iterable[str | None]) -> Iterator[tuple[int, int]]:
    client, bucket = executor_store(config, dc), config.stores[dc].bucket
    count = size = 0
    for first in shards:
        for item in list_versions_shard(client, bucket, prefix, first):
            if "Size" in item and not item["IsLatest"]:
                count, size = count + 1, size + item["Size"]
    yield count, size


def _list_task(config: PurgerConfig, prefix: str, dc: str, cutoff_ms: int, listed: Any,
               shards: Iterable[str | None]) -> Iterator[tuple[str, int, str | None]]:
    """One Spark task: its shards of a data centre's bucket, each blob under the prefix old enough by the
    listing as ``(id, last_modified_ms, etag)``. A key that is the prefix itself or ends in ``/`` (a
    folder's marker) names no object and is left alone."""
    client = executor_store(config, dc)
    bucket = config.stores[dc].bucket
    count = 0
    for first in shards:
        for item in list_shard(client, bucket, prefix, first):
            object_id = item["Key"][len(prefix):]
            if not object_id or object_id.endswith("/"):
                continue
            count += 1
            modified = epoch_ms(item["LastModified"])
            if modified < cutoff_ms:
                yield object_id, modified, item.get("ETag")
    listed.add(count)


def listed_blobs(spark: SparkSession, config: PurgerConfig, prefix: str, dc: str, cutoff_ms: int,
                 listed: Any) -> DataFrame:
    """Every blob of ``dc``'s bucket under ``prefix`` last modified before ``cutoff_ms`` (id, last_modified_ms,
    etag), listed in Spark tasks; ``listed`` counts every key under the prefix."""
    shards: list[str | None] = [*SHARD_CHARACTERS, None]
    tasks = min(len(shards), spark.sparkContext.defaultParallelism * 4)
    rows = spark.sparkContext.parallelize(shards, tasks).mapPartitions(
        partial(_list_task, config, prefix, dc, cutoff_ms, listed))
    return spark.createDataFrame(rows, _LISTED)
