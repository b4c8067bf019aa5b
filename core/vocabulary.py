"""The words the engine, the ledger, the report and the metrics share: outcome statuses, the kinds
that are not objects, reason categories. One place, so a status is never misspelt in one file.

Example::

    from purger.core.vocabulary import PURGED, reason, LIVE_REASON
    reason(LIVE_REASON, "extract_count 3")   # 'live: extract_count 3'
"""

from __future__ import annotations

# Outcome statuses: a deletion, then the decisions not to delete (the daily report's columns).
PURGED = "purged"
WOULD_DELETE = "would_delete"  # a dry run's decision
ALREADY_GONE = "already_gone"
SKIPPED = "skipped"
ERROR = "error"
DEAD_LETTERED = "dead_lettered"
STATUSES = (PURGED, WOULD_DELETE, ALREADY_GONE, SKIPPED, ERROR, DEAD_LETTERED)
# Not an outcome: a command that changes what is deleted (a reconcile or a replay started by hand), with who ran
# it (``actor``) and why (``reason``), recorded in the ledger beside what it did.
COMMAND = "command"
# Not outcomes of the stream either: `purger restore`'s records of a deletion put back, or not (with why: past
# the undo window, written again since), kept out of the daily report's counts of decisions.
RESTORED = "restored"
NOT_RESTORED = "not_restored"

# Rows of the stateful stage that are not objects of a policy.
DEAD_LETTER = "dead_letter"  # a bad record, passed through to the sink
CLOCK = "clock"  # a clock tick: it only moves the watermark
ENGINE = "engine"  # the policy column of dead letters
# The rule of the stateful stage's row for an object forgotten without ever having been a candidate
# (``core.schedule.on_events``): counted, never decided.
FORGOTTEN = "forgotten"

# The rule of a blob reconciliation deletes for having no row (``reconcile.orphans``), as the ledger names it.
ORPHAN = "orphan"
# The data centre the report and the reconcile report give what is not one data centre's: a Cassandra row, a
# table's scan, a table's orphan rows (whichever data centre served them).
ALL_DCS = "all"

# Reason categories: a skip's reason is "<category>: <details>"; the report counts the categories.
LIVE_REASON = "live"
NOT_YET_DUE = "not yet due"
REFERENCED = "referenced"
RECENTLY_LINKED = "recently linked"
RELINKED = "relinked"
BEING_DELETED = "being deleted"
PRESENT = "present"
KEPT_BY_RULE = "kept"
# Under a legal hold (``purger.core.holds``): kept whatever the rules say, until the hold is released.
HELD = "held"
# A deletion recorded from the purger's intent (``purger.core.handles.Journal``): found gone after the intent.
EARLIER_ATTEMPT = "earlier attempt"
# Gone, but not by the purger: another writer removed it between the purger's check and its delete.
REMOVED_MEANWHILE = "removed meanwhile"
# How a blob went from a bucket with versioning on (``purger.sinks.objects``; ``stores.<dc>.noncurrent_versions``):
# every version of its key removed, or a delete marker whose noncurrent versions the bucket's lifecycle rule expires.
EVERY_VERSION = "every version"
BY_LIFECYCLE = "versions by lifecycle"


def reason(category: str, details: str) -> str:
    return f"{category}: {details}"


def category(text: str) -> str:
    """The category of a reason (what the report groups skips by)."""
    return text.split(":", 1)[0]
