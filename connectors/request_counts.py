"""Every request a Cassandra session sends, counted by what it costs the cluster: a lightweight transaction
and a serial read are each a Paxos round (four round trips between replicas and writes to the Paxos
table), a plain read and a plain write one round trip each. Counted from the driver's own hook
(``Session.add_request_init_listener``), so nothing sent on the session escapes it, the journal's
requests and the engine's included.

Example::

    counts = RequestCounts.attach(session)
    purge.purge(candidate, attempt)
    counts.taken()        # Counter({'plain_read': 2, 'lightweight_transaction': 1, 'plain_write': 1})
    counts.detach()
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cassandra.cluster import ResponseFuture, Session

LIGHTWEIGHT_TRANSACTION = "lightweight_transaction"
SERIAL_READ = "serial_read"
PLAIN_READ = "plain_read"
PLAIN_WRITE = "plain_write"
REQUEST_KINDS = (LIGHTWEIGHT_TRANSACTION, SERIAL_READ, PLAIN_READ, PLAIN_WRITE)
PAXOS_ROUNDS = (LIGHTWEIGHT_TRANSACTION, SERIAL_READ)

# A condition clause of a write (``IF EXISTS``, ``IF NOT EXISTS``, ``IF <column> ...``) makes it a
# lightweight transaction; DDL's ``IF NOT EXISTS`` is not a request of the purge's.
_CONDITION = re.compile(r"\sIF\s", re.IGNORECASE)
_DDL = re.compile(r"^\s*(CREATE|ALTER|DROP|TRUNCATE)\b", re.IGNORECASE)


def request_kind(cql: str, serial: bool) -> str:
    """What a request of ``cql`` costs, read at a serial consistency when ``serial``.

    >>> request_kind("SELECT * FROM m WHERE id = ?", serial=True)
    'serial_read'
    >>> request_kind("DELETE FROM m WHERE id = ? IF extract_count = 0", serial=False)
    'lightweight_transaction'
    >>> request_kind("DELETE FROM refs WHERE payload_id = ?", serial=False)
    'plain_write'
    """
    if cql.lstrip()[:6].upper() == "SELECT":
        return SERIAL_READ if serial else PLAIN_READ
    if _CONDITION.search(cql) and not _DDL.match(cql):
        return LIGHTWEIGHT_TRANSACTION
    return PLAIN_WRITE


class RequestCounts:
    """The requests a session sent since ``attach``, by ``request_kind``; thread-safe."""

    def __init__(self, session: "Session") -> None:
        from cassandra import ConsistencyLevel

        self.session = session
        self._serial = {ConsistencyLevel.SERIAL, ConsistencyLevel.LOCAL_SERIAL}
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    @classmethod
    def attach(cls, session: "Session") -> "RequestCounts":
        counts = cls(session)
        session.add_request_init_listener(counts._sent)
        return counts

    def detach(self) -> None:
        self.session.remove_request_init_listener(self._sent)

    def taken(self) -> Counter[str]:
        """The counts so far, and a fresh start."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return counts

    def _sent(self, future: "ResponseFuture", *_: Any) -> None:
        query = future.query
        prepared = getattr(query, "prepared_statement", None)
        cql = prepared.query_string if prepared is not None else getattr(query, "query_string", str(query))
        kind = request_kind(cql, getattr(future.message, "consistency_level", None) in self._serial)
        with self._lock:
            self._counts[kind] += 1
