"""What the engine hands a policy's delete-time half on each executor (``Resources``, made once per process
and shared by the policies' purges): its typed handle on its Cassandra tables (``Tables``), the sink's reports
back to the stateful stage (``Control``), and the purger's journal of intents (``Journal``). A policy of one's
own imports these from ``purger.core.policy``; the engine's are ``CassandraTables`` (``purger.connectors``),
``ControlWriter`` (``purger.streams.control``) and ``CassandraJournal`` (``purger.sinks.journal``).

Example::

    tables = resources.tables(policy.table_names())   # the policy's handle, its names configured
    resources.control.recheck("push_client", "c1", "inactive", at_ms)   # look at c1 again then
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal

from purger.core.holds import Holds

if TYPE_CHECKING:
    from purger.core.restorations import Aside

__all__ = ["Consistency", "Control", "Failures", "Journal", "Resources", "Retry", "Tables"]


class Control(ABC):
    """The sink's reports back to the stateful stage (``purger.streams.control``)."""

    @abstractmethod
    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        """Look at the object again once the watermark passes ``at_ms``."""

    @abstractmethod
    def report(self, event_type: str, object_id: str, event_time_ms: int, **fields: Any) -> None:
        """Send one of a policy's own control events (``EventType.control``) about ``object_id``."""


class Journal(ABC):
    """The purger's intents (DELF's restoration log, in spirit): before a purge deletes anything of an
    object, it keeps what it is about to delete, each item with the batch that means to delete it
    (``Attempt.batch``). A row found gone is the purger's deletion only if its intent is there: a crash
    between a delete and its record loses the outcome, never the intent, and a row the platform removed
    itself has none. Keys are ``Dependent.key`` (the object itself: ``SELF``); an intent replaces the one
    before it."""

    @abstractmethod
    def intend(self, kind: str, object_id: str, intent: dict[str, str]) -> None:
        """Keep ``intent`` (key -> the batch that means to delete it) for the object, replacing any before."""

    @abstractmethod
    def intended(self, kind: str, object_id: str) -> dict[str, str]:
        """The object's intent (key -> batch); empty when there is none."""


@dataclass(frozen=True)
class Retry:
    """When to try a failed purge again, and whether its error goes to the ledger (``Failures.failed``)."""

    at_ms: int
    record: bool
    failures: int  # in a row, this one included


class Failures(ABC):
    """The objects whose purge fails (``purger.core.retries``): each failure backs the next attempt off, to
    ``stream.retry_cap``, and its error is recorded once a day. The engine's is
    ``purger.sinks.failures.CassandraFailures``."""

    @abstractmethod
    def failed(self, kind: str, object_id: str, error: str) -> Retry:
        """The object's purge failed now with ``error``: when to try again, and whether to record it."""


Consistency = Literal["configured", "serial", "quorum", "local_quorum"]


class Tables(ABC):
    """A policy's typed handle on its Cassandra tables, made by the engine on each executor.

    CQL names tables by their reference names in braces (``{users}``, as in ``Policy.tables``); the handle
    puts the configured keyspace and names in, prepares each statement once and runs it at the configured
    consistency, or at the one asked for: ``serial`` reads see the outcome of every lightweight
    transaction, a writer's or a claim's, even one not yet settled.

    Example::

        read = tables.prepare("SELECT state, updated_at FROM {users} WHERE user_id = ?", "serial")
        row = tables.one(read, "u1")             # a named tuple, or None
        claim = tables.prepare("UPDATE {users} SET state = 'purging' WHERE user_id = ? IF state = 'live'")
        tables.applied(claim, "u1")               # True once the lightweight transaction applied
    """

    @abstractmethod
    def prepare(self, cql: str, consistency: Consistency = "configured") -> Any:
        """The prepared statement of ``cql``, its ``{table}`` names resolved."""

    @abstractmethod
    def one(self, statement: Any, *values: Any, serial: bool = False) -> Any | None:
        """The first row the statement returns (a named tuple), or None; ``serial``: read at the serial
        consistency this time, whatever the statement's own."""

    @abstractmethod
    def all(self, statement: Any, *values: Any) -> list[Any]:
        """Every row the statement returns, all pages."""

    @abstractmethod
    def applied(self, statement: Any, *values: Any) -> bool:
        """Run a lightweight transaction (``... IF ...``); whether it applied."""

    @abstractmethod
    def execute(self, statement: Any, *values: Any) -> None:
        """Run a plain write."""


@dataclass
class Resources:
    """What an executor shares between the policies' purges: made once per process by the engine."""

    # Each policy's handle on its tables: ``tables(policy.table_names())``.
    tables: Callable[[dict[str, str]], Tables]
    # purger.sinks.objects.ObjectStores: delete(key, dcs) -> {dc: error, or None or Deleted once done}
    stores: Any
    control: Control
    journal: Journal
    holds: Holds  # the legal holds in force (``purger.core.holds``)
    failures: Failures  # when a failed purge is tried again
    retry_ms: int  # the soonest a candidate found not due under its own rule is looked at again
    dry_run: bool  # decide and record would_delete; delete nothing
    aside: "Aside | None" = None  # with an undo window, where images go before each delete (core.restorations)
