"""A stand-in for the platform's users (docs/policies.md, users): the writer side of the ``users`` policy's contract.

Each data centre's directory adds and removes users on its own; the platform
keeps per user a ``users`` row, a virtual root and permission rows. Adding and
removing follow the writer contract of ``policies.users``: the ``users`` row
changes only by lightweight transactions, an add waits out a purge that has
claimed the row, and the dependents are written only once the add applied.
Each change is followed by its event (``user_added`` / ``user_removed``),
keyed by ``user_id``. A change may be dated in the past (``at``) to make rows
old.

Example::

    from purger.core.settings import CassandraConfig, KafkaConfig
    from purger.policies.users import UsersSettings
    platform = UsersPlatform(KafkaConfig(), CassandraConfig(), "users.events", "mailbox", UsersSettings())
    platform.add_user("u1", "dc1", mailboxes=("u1/inbox", "shared/sales"))
    platform.remove_user("u1", "dc1")
    platform.rows("u1")   # {'user': {'present_in': None, 'state': 'live', ...}, 'virtual_root': 'u1/inbox', ...}
    platform.flush()
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Sequence

from purger.connectors import read_serially
from purger.core.settings import CassandraConfig, KafkaConfig
from purger.policies.users import LIVE, USER_ADDED, USER_REMOVED, UsersSettings
from simulation.clock import now
from simulation.events import EventWriter

# How long an add waits before trying again when a purge holds the user's row.
RETRY_S = 0.005
PERMISSIONS = frozenset({"read", "write"})


class UsersPlatform(EventWriter):
    """The platform's writes of users in each data centre, each followed by its event."""

    id_field = "user_id"

    def __init__(self, kafka: KafkaConfig, cassandra: CassandraConfig, topic: str, keyspace: str,
                 settings: UsersSettings) -> None:
        super().__init__(kafka, cassandra, topic)
        prepare = self.session.prepare
        users, roots, permissions = (f"{keyspace}.{table}" for table in (
            settings.users_table, settings.virtual_roots_table, settings.permissions_table))
        self._insert_user = prepare(f"INSERT INTO {users} (user_id, present_in, state, updated_at) "
                                    f"VALUES (?, ?, '{LIVE}', ?) IF NOT EXISTS")
        self._add_dc = prepare(f"UPDATE {users} SET present_in = present_in + ?, updated_at = ? WHERE user_id = ? "
                               f"IF state = '{LIVE}'")
        self._remove_dc = prepare(f"UPDATE {users} SET present_in = present_in - ?, updated_at = ? "
                                  f"WHERE user_id = ? IF state = '{LIVE}'")
        self._write_root = prepare(f"INSERT INTO {roots} (user_id, mailbox) VALUES (?, ?)")
        self._write_permission = prepare(f"INSERT INTO {permissions} (user_id, mailbox, permissions) VALUES (?, ?, ?)")
        self._read_user = read_serially(self.session, prepare(f"SELECT * FROM {users} WHERE user_id = ?"))
        self._read_root = prepare(f"SELECT mailbox FROM {roots} WHERE user_id = ?")
        self._read_permissions = prepare(f"SELECT mailbox, permissions FROM {permissions} WHERE user_id = ?")

    def add_user(self, user_id: str, dc: str, mailboxes: Sequence[str] = ("inbox",),
                 at: datetime | None = None) -> None:
        """``dc``'s directory added the user: its row, then its virtual root (the first of ``mailboxes``) and
        a permission row per mailbox, then its event. Blocks while a purge of the user is under way."""
        at = at or now()
        # (a) Either applies only while no purge holds the row ('purging'); a purge deletes it soon.
        while not (self.session.execute(self._insert_user, (user_id, {dc}, at)).was_applied
                   or self.session.execute(self._add_dc, ({dc}, at, user_id)).was_applied):
            time.sleep(RETRY_S)
        # (b) Only now: a purge that claimed the row before our add has already deleted its dependents.
        self.session.execute(self._write_root, (user_id, mailboxes[0]))
        for mailbox in mailboxes:
            self.session.execute(self._write_permission, (user_id, mailbox, PERMISSIONS))
        self._emit(USER_ADDED, user_id, at, dc=dc)

    def remove_user(self, user_id: str, dc: str, at: datetime | None = None) -> None:
        """``dc``'s directory removed the user. Its rows stay: they are the purger's to delete."""
        at = at or now()
        # Not applied when no live row is left: a purge holds it or deleted it; the event is true all the same.
        self.session.execute(self._remove_dc, ({dc}, at, user_id))
        self._emit(USER_REMOVED, user_id, at, dc=dc)

    def rows(self, user_id: str) -> dict[str, Any]:
        """What the user has: ``user`` (its ``users`` row, or None), ``virtual_root`` (its mailbox, or None)
        and ``permissions`` ({mailbox: permissions})."""
        user = self.session.execute(self._read_user, (user_id,)).one()
        root = self.session.execute(self._read_root, (user_id,)).one()
        return {
            "user": user._asdict() if user else None,
            "virtual_root": root.mailbox if root else None,
            "permissions": {r.mailbox: set(r.permissions or ()) for r in
                            self.session.execute(self._read_permissions, (user_id,))},
        }
