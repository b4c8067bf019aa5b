"""Blobs in the object store of each data centre: one S3 bucket per data centre.

Each data centre is deleted from on its own and reports its own outcome, so one
store failing does not hold the others back.

Example::

    stores = ObjectStores(config.stores)
    stores.delete("payloads/p1", ["dc1", "dc2"])  # {'dc1': None, 'dc2': None}  (None: deleted)
"""

from __future__ import annotations

from purger.core.settings import ObjectStoreConfig
from purger.connectors import s3_client


class ObjectStores:
    """One S3 client per data centre, made on first use."""

    def __init__(self, stores: dict[str, ObjectStoreConfig]) -> None:
        self.stores = stores
        self._clients: dict[str, object] = {}

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
