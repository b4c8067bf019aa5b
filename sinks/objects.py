"""Blobs in the object store of each data centre: one S3 bucket per data centre.

Each data centre is deleted from on its own and reports its own outcome, so one
store failing does not hold the others back.

A blob deleted only in case it is left (a payload found gone: ``delete_later``)
waits for the task's end, and goes with up to 1,000 others of its data centre in
one multi-object delete (S3's ``DeleteObjects``): one request per blob costs a
core's millisecond in boto3 alone, and a replay finds every payload gone.

Example::

    stores = ObjectStores(config.stores)
    stores.delete("payloads/p1", ["dc1", "dc2"])  # {'dc1': None, 'dc2': None}  (None: deleted)
    stores.delete_later("payloads/p2", ["dc1", "dc2"])
    stores.flush()                                 # {'dc1': [], 'dc2': []}  (the keys that failed)
"""

from __future__ import annotations

import logging
import threading

from purger.core.config import ObjectStoreConfig
from purger.connectors import s3_client

log = logging.getLogger(__name__)

# S3's most keys in one DeleteObjects request.
MOST_KEYS_PER_REQUEST = 1000


class ObjectStores:
    """One S3 client per data centre, made on first use."""

    def __init__(self, stores: dict[str, ObjectStoreConfig], keys_per_request: int = MOST_KEYS_PER_REQUEST) -> None:
        self.stores = stores
        self.keys_per_request = keys_per_request
        self._clients: dict[str, object] = {}
        self._later: dict[str, list[str]] = {}  # by data centre: keys waiting for ``flush``
        self._lock = threading.Lock()

    def _client(self, dc: str):
        if dc not in self._clients:
            self._clients[dc] = s3_client(self.stores[dc])
        return self._clients[dc]

    def delete(self, key: str, dcs: list[str]) -> dict[str, str | None]:
        """Delete ``key`` from each data centre's bucket; per data centre None on success, else the error.

        Deleting a key that is already gone succeeds (S3 semantics), so a retried batch is harmless.
        """
        errors: dict[str, str | None] = {}
        for dc in dcs:
            if dc not in self.stores:
                errors[dc] = f"no object store configured for data centre {dc!r}"
                continue
            try:
                self._client(dc).delete_object(Bucket=self.stores[dc].bucket, Key=key)
                errors[dc] = None
            except Exception as error:  # botocore raises many kinds; each is this DC's failure
                errors[dc] = f"{self.stores[dc].endpoint}: {error}"
        return errors

    def delete_later(self, key: str, dcs: list[str]) -> None:
        """Delete ``key`` from each data centre's bucket at the next ``flush``, or once ``keys_per_request``
        keys of a data centre wait. For a blob that may be left: nothing waits on it, and a key that failed is
        a blob without a row, which the orphan sweep finds."""
        full = {}
        with self._lock:
            for dc in dcs:
                waiting = self._later.setdefault(dc, [])
                waiting.append(key)
                if len(waiting) >= self.keys_per_request:
                    full[dc] = self._later.pop(dc)
        for dc, keys in full.items():
            self._delete_many(dc, keys)

    def flush(self) -> dict[str, list[str]]:
        """Send what ``delete_later`` keeps; per data centre, the keys that failed (each failure logged)."""
        with self._lock:
            waiting, self._later = self._later, {}
        return {dc: self._delete_many(dc, keys) for dc, keys in waiting.items()}

    def _delete_many(self, dc: str, keys: list[str]) -> list[str]:
        if dc not in self.stores:
            log.warning("%d blobs left in data centre %r were not deleted: no object store is configured for it",
                        len(keys), dc)
            return keys
        store, failed = self.stores[dc], []
        for start in range(0, len(keys), self.keys_per_request):
            chunk = keys[start:start + self.keys_per_request]
            try:
                answer = self._client(dc).delete_objects(
                    Bucket=store.bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})
                errors = answer.get("Errors", [])
                failed.extend(e["Key"] for e in errors)
                if errors:
                    log.warning("%d of %d blobs left in bucket %s at %s were not deleted (%s: %s); the orphan sweep "
                                "finds them", len(errors), len(chunk), store.bucket, store.endpoint,
                                errors[0].get("Code"), errors[0].get("Message"))
            except Exception as error:  # botocore raises many kinds; each is this DC's failure
                failed.extend(chunk)
                log.warning("%d blobs left in bucket %s at %s were not deleted (%s); the orphan sweep finds them",
                            len(chunk), store.bucket, store.endpoint, error)
        return failed
