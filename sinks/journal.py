"""The purger's journal in Cassandra (``core.policy.Journal``): the dependents a claimed purge is about to
delete, per batch, so that a retry of the batch records those a crashed attempt deleted; and each batch
partition's start, so that any second run of it (a task, stage or batch retry) knows it is a retry.

One table of the purger's own, in the configured keyspace (``cassandra.journal_table``); ``purger setup``
creates it. An entry is read only by a retry of the batch that wrote it, so entries expire on their own
(``default_time_to_live``, 30 days: a batch retried later than that records the dependents its failed
attempt deleted as nothing, the object itself still as purged).

Example::

    journal = CassandraJournal(session, "mailbox", "purger_journal")
    journal.keep("user", "u1", "query-1/42", {"virtual_root:u1", "mailbox_permission:u1/inbox"})
    journal.kept("user", "u1", "query-1/42")   # {'virtual_root:u1', 'mailbox_permission:u1/inbox'}
    journal.kept("user", "u1", "query-1/43")   # None: another batch's
    journal.first_start("query-1/42", 3)        # True; False in any later run of partition 3 of that batch
"""

from __future__ import annotations

from typing import Any

from purger.core.policy import Journal

JOURNAL_TTL_S = 30 * 24 * 3600

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {keyspace}.{table} (
  kind        text,
  object_id   text,
  purge_batch text,     -- <query id>/<batch id> of the purge that wrote it
  rows        set<text>,  -- kind:id of each dependent, as the ledger names them
  PRIMARY KEY ((kind, object_id))
) WITH default_time_to_live = %d
""" % JOURNAL_TTL_S

JOURNAL_COLUMNS = frozenset({"kind", "object_id", "purge_batch", "rows"})
# The kind of a partition's start in the journal: not an identifier, so no policy's kind of object.
PARTITION_START = "(partition)"
PARTITION_START_TTL_S = 24 * 3600


def journal_schema(keyspace: str, table: str) -> str:
    """The CQL that creates the journal table ``keyspace.table`` if it does not exist."""
    return _SCHEMA.format(keyspace=keyspace, table=table).strip()


def create_journal(session: Any, keyspace: str, table: str) -> None:
    """Create the journal table ``keyspace.table`` if it does not exist."""
    session.execute(journal_schema(keyspace, table), timeout=60)


class CassandraJournal(Journal):
    def __init__(self, session: Any, keyspace: str, table: str) -> None:
        self.session = session
        name = f"{keyspace}.{table}"
        self.insert = session.prepare(f"INSERT INTO {name} (kind, object_id, purge_batch, rows) VALUES (?, ?, ?, ?)")
        self.select = session.prepare(f"SELECT purge_batch, rows FROM {name} WHERE kind = ? AND object_id = ?")
        # A start matters to the runs of its batch: the task and stage retries within minutes, a batch retry
        # at the next start (which the driver's attempt marker knows as well); a day, not the journal's 30.
        self.start = session.prepare(f"INSERT INTO {name} (kind, object_id, purge_batch) VALUES (?, ?, ?) "
                                     f"IF NOT EXISTS USING TTL {PARTITION_START_TTL_S}")

    def keep(self, kind: str, object_id: str, batch: str, rows: set[str]) -> None:
        self.session.execute(self.insert, (kind, object_id, batch, rows))

    def kept(self, kind: str, object_id: str, batch: str) -> set[str] | None:
        found = self.session.execute(self.select, (kind, object_id)).one()
        if found is None or found.purge_batch != batch:
            return None
        return set(found.rows or ())

    def first_start(self, batch: str, partition: int) -> bool:
        """Note that partition ``partition`` of ``batch`` starts purging; False when a run of it started before.
        Spark runs a partition again after a task failed, an executor was lost (a stage retry, whose task
        attempts count from 0 again) or the batch failed: what that run finds gone, the one before deleted."""
        return self.session.execute(self.start, (PARTITION_START, f"{batch}/{partition}", batch)).was_applied
