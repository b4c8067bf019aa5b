"""Blobs in the object store of each data centre: one S3 bucket per data centre.

Each data centre is deleted from on its own and reports its own outcome, so one
store failing does not hold the others back. In a bucket with versioning on, a
delete only adds a delete marker over the key's versions, which stay, billed:
``delete_blob`` then removes them, or leaves them to the bucket's lifecycle rule
(``stores.<dc>.noncurrent_versions``), and says which for the ledger.

Example::

    stores = ObjectStores(config.stores)
    stores.delete("payloads/p1", ["dc1", "dc2"])  # {'dc1': None, 'dc2': Deleted(reason='every version: ...')}
"""

from __future__ import annotations

from typing import Any, Iterator

from purger.connectors import s3_client
from purger.core.purge_protocol import Deleted
from purger.core.settings import ObjectStoreConfig
from purger.core.vocabulary import BY_LIFECYCLE, EVERY_VERSION, reason

# DeleteObjects takes at most this many keys (or versions) a request.
DELETE_BATCH = 1000


class ObjectStores:
    """One S3 client per data centre, made on first use."""

    def __init__(self, stores: dict[str, ObjectStoreConfig]) -> None:
        self.stores = stores
        self._clients: dict[str, object] = {}

    def _client(self, dc: str):
        if dc not in self._clients:
            self._clients[dc] = s3_client(self.stores[dc])
        return self._clients[dc]

    def for_threads(self) -> ObjectStores:
        """These stores with each data centre's client made now, to be shared by threads: boto3 makes no two
        clients at once safely."""
        for dc in self.stores:
            self._client(dc)
        return self

    def delete(self, key: str, dcs: list[str]) -> dict[str, str | Deleted | None]:
        """Delete ``key`` from each data centre's bucket; per data centre None on success (``Deleted`` in a
        bucket that keeps versions: how), else the error.

        Deleting a key that is already gone succeeds (S3 semantics), so a retried batch is harmless.
        """
        errors: dict[str, str | Deleted | None] = {}
        for dc in dcs:
            if dc not in self.stores:
                errors[dc] = f"no object store configured for data centre {dc!r}"
                continue
            try:
                errors[dc] = delete_blob(self._client(dc), self.stores[dc], key)
            except Exception as error:  # botocore raises many kinds; each is this DC's failure
                errors[dc] = f"{self.stores[dc].endpoint}: {error}"
        return errors


    def copy(self, dc: str, key: str, to_key: str) -> bool | str:
        """Copy ``key`` to ``to_key`` in the data centre's bucket, on the server (no bytes through the purger): True
        once copied, False when there is no ``key`` to copy, else the error."""
        if dc not in self.stores:
            return f"no object store configured for data centre {dc!r}"
        bucket = self.stores[dc].bucket
        try:
            self._client(dc).copy_object(Bucket=bucket, Key=to_key, CopySource={"Bucket": bucket, "Key": key})
            return True
        except Exception as error:  # botocore raises many kinds; each is this DC's failure
            if _no_such_key(error):
                return False
            return f"{self.stores[dc].endpoint}: {error}"


def _no_such_key(error: Exception) -> bool:
    response = getattr(error, "response", None) or {}
    return response.get("Error", {}).get("Code") in ("NoSuchKey", "404")


def bucket_versioning(client: Any, bucket: str) -> str | None:
    """Whether ``bucket`` keeps versions: ``Enabled``, ``Suspended`` (it keeps those it has), or None (never
    enabled, or a store without versioning, such as S3Proxy's filesystem backend)."""
    from botocore.exceptions import ClientError

    try:
        return client.get_bucket_versioning(Bucket=bucket).get("Status")
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "NotImplemented":
            raise
        return None


def delete_blob(client: Any, store: ObjectStoreConfig, key: str) -> Deleted | None:
    """Delete ``key`` from ``store``'s bucket: None when the bucket keeps no versions. With versioning on (or
    suspended) the delete leaves a delete marker over the key's versions; with ``noncurrent_versions = "delete"``
    the marker and every version written no later than it are removed by their ids (one written after it, a new
    upload of the key, is not the purger's), with ``"lifecycle"`` they are left to the bucket's lifecycle rule.
    Either way, what the ledger's record says (``Deleted``)."""
    answer = client.delete_object(Bucket=store.bucket, Key=key)
    if not answer.get("DeleteMarker"):
        return None
    if store.noncurrent_versions == "lifecycle":
        return Deleted(reason(BY_LIFECYCLE, "a delete marker; the noncurrent versions are the bucket's lifecycle "
                                            "rule's to expire"))
    versions = list(_versions_up_to(client, store.bucket, key, answer.get("VersionId")))
    for start in range(0, len(versions), DELETE_BATCH):
        done = client.delete_objects(Bucket=store.bucket, Delete={
            "Objects": [{"Key": key, "VersionId": version} for version in versions[start:start + DELETE_BATCH]],
            "Quiet": True})
        if done.get("Errors"):
            first = done["Errors"][0]
            raise RuntimeError(f"bucket {store.bucket}: version {first.get('VersionId')} of {key} not deleted: "
                               f"{first.get('Code')} {first.get('Message')}")
    return Deleted(reason(EVERY_VERSION, f"{len(versions)} versions and delete markers removed"))


def _versions_up_to(client: Any, bucket: str, key: str, marker: str | None) -> Iterator[str]:
    """The ids of ``key``'s versions and delete markers written no later than the delete marker ``marker``
    (every one when it is not found: a listing that does not show it yet)."""
    found: list[tuple[Any, str]] = []
    paging: dict[str, str] = {}
    while True:
        page = client.list_object_versions(Bucket=bucket, Prefix=key, **paging)
        found.extend((item["LastModified"], item["VersionId"])
                     for item in page.get("Versions", []) + page.get("DeleteMarkers", []) if item["Key"] == key)
        if not page.get("IsTruncated") or page.get("NextKeyMarker", key) > key:
            break
        paging = {"KeyMarker": page["NextKeyMarker"], "VersionIdMarker": page.get("NextVersionIdMarker", "")}
    ours = [moment for moment, version in found if version == marker]
    for moment, version in found:
        if not ours or moment <= ours[0]:
            yield version
