"""The purger's journal in Cassandra (``core.handles.Journal``): per object, the purger's intent, kept before it
deletes anything of it (each dependent's key and the row's, with the batch that means to delete it), so that a
row found gone is recorded as the purger's deletion only when the purger meant it.

One table of the purger's own, in the configured keyspace (``cassandra.journal_table``); ``purger setup``
creates it. An intent is read when its object is found gone or claimed again, so entries expire on their own
(``default_time_to_live``, 30 days: an object found gone later than that is recorded ``already_gone``; its
deletion was recorded by the batch that made it, unless that batch never reached the ledger for 30 days). Every
entry has that TTL and an object's are written during its purge, so the table compacts by day windows: a day's
SSTable expires whole and is dropped without being compacted (docs/operations.md, Tables and tombstones).

Example::

    journal = CassandraJournal(session, "mailbox", "purger_journal")
    journal.intend("user", "u1", {SELF: "query-1/42", '["virtual_root", "u1", null]': "query-1/42"})
    journal.intended("user", "u1")   # {'null': 'query-1/42', '["virtual_root", "u1", null]': 'query-1/42'}
    journal.intended("user", "u2")   # {}
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from purger.connectors.cassandra_client import ROWS, own_profile
from purger.core.handles import Journal

JOURNAL_TTL_S = 30 * 24 * 3600

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {keyspace}.{table} (
  kind        text,
  object_id   text,
  purge_batch text,     -- <query id>/<batch id> of the purge that wrote it
  rows        set<text>,  -- the intent: [key, batch] of each deletion it means, as JSON
  PRIMARY KEY ((kind, object_id))
) WITH default_time_to_live = %d
  AND compaction = {{'class': 'TimeWindowCompactionStrategy', 'compaction_window_unit': 'DAYS',
                    'compaction_window_size': 1}}
""" % JOURNAL_TTL_S

JOURNAL_COLUMNS = frozenset({"kind", "object_id", "purge_batch", "rows"})


def journal_schema(keyspace: str, table: str) -> str:
    """The CQL that creates the journal table ``keyspace.table`` if it does not exist."""
    return _SCHEMA.format(keyspace=keyspace, table=table).strip()


class CassandraJournal(Journal):
    def __init__(self, session: Any, keyspace: str, table: str) -> None:
        self.session = session
        self.rows_profile = own_profile(session, ROWS)
        self.name = name = f"{keyspace}.{table}"
        self.insert = session.prepare(f"INSERT INTO {name} (kind, object_id, purge_batch, rows) VALUES (?, ?, ?, ?)")
        self.select = session.prepare(f"SELECT purge_batch, rows FROM {name} WHERE kind = ? AND object_id = ?")
        self.add = session.prepare(f"UPDATE {name} SET rows = rows + ? WHERE kind = ? AND object_id = ?")
        self.take = session.prepare(f"UPDATE {name} SET rows = rows - ? WHERE kind = ? AND object_id = ?")

    def intend(self, kind: str, object_id: str, intent: dict[str, str]) -> None:
        self.session.execute(self.insert, self.intent_values(kind, object_id, intent))

    @staticmethod
    def intent_values(kind: str, object_id: str, intent: dict[str, str]) -> tuple[str, str, str, set[str]]:
        """The values ``insert`` binds for ``intent`` (each key with the batch that means to delete it)."""
        entries = {json.dumps([key, batch]) for key, batch in intent.items()}
        return kind, object_id, max(intent.values(), default=""), entries

    # A set of names kept in one row, added to and taken from without a read: the orphan sweep's notes
    # (``reconcile.sweeps``: the sweeps under way, and the blobs each is about to delete).

    def note(self, kind: str, object_id: str, names: set[str]) -> None:
        self.session.execute(self.add, (names, kind, object_id))

    def unnote(self, kind: str, object_id: str, names: set[str]) -> None:
        self.session.execute(self.take, (names, kind, object_id))

    def noted(self, kind: str, object_id: str) -> set[str]:
        found = self.session.execute(self.select, (kind, object_id), execution_profile=self.rows_profile).one()
        return set(found.rows or ()) if found else set()

    # A lease, held by one holder at a time until it expires or is given up: the orphan sweeps' (one sweep of a
    # bucket or table at a time, ``reconcile.sweeps``). Lightweight transactions only, at the session's serial
    # consistency, so that two takers never both win; ``ttl_s`` bounds how long a holder that died keeps it.

    def lease(self, kind: str, object_id: str, holder: str, ttl_s: int) -> str | None:
        """Take, or renew, ``holder``'s lease for ``ttl_s`` seconds: None once it holds it, else the holder that
        does."""
        taken = self.session.execute(self._lease_take, (kind, object_id, holder, ttl_s))
        if taken.was_applied:
            return None
        current = taken.one().purge_batch
        if current != holder:
            return current
        renewed = self.session.execute(self._lease_renew, (ttl_s, holder, kind, object_id, holder))
        return None if renewed.was_applied else renewed.one().purge_batch

    def give_up(self, kind: str, object_id: str, holder: str) -> None:
        """End ``holder``'s lease, if it still holds it."""
        self.session.execute(self._lease_end, (kind, object_id, holder))

    @cached_property
    def _lease_take(self) -> Any:
        return self.session.prepare(f"INSERT INTO {self.name} (kind, object_id, purge_batch) VALUES (?, ?, ?) "
                                    f"IF NOT EXISTS USING TTL ?")

    @cached_property
    def _lease_renew(self) -> Any:
        return self.session.prepare(f"UPDATE {self.name} USING TTL ? SET purge_batch = ? WHERE kind = ? AND "
                                    f"object_id = ? IF purge_batch = ?")

    @cached_property
    def _lease_end(self) -> Any:
        return self.session.prepare(f"DELETE FROM {self.name} WHERE kind = ? AND object_id = ? IF purge_batch = ?")

    def intended(self, kind: str, object_id: str) -> dict[str, str]:
        found = self.session.execute(self.select, (kind, object_id), execution_profile=self.rows_profile).one()
        if found is None:
            return {}
        intent = {}
        for entry in found.rows or ():
            item = json.loads(entry)
            # An entry of a purger before intents: a dependent's key alone, under the row's batch.
            key, batch = (item if len(item) == 2 else (entry, found.purge_batch))
            intent[key] = batch
        return intent
