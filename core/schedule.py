"""When the stateful stage looks at an object again: its one timer, rechecks and forgetting. Plain Python.

An object is due when its own eligibility (its policy's rules) has come, or when
the purge sink asked for a recheck (the double-check kept it, or a data centre
failed, and the row says when to look again). When the watermark passes the due
time the object becomes a purge candidate. Candidates may be redundant (the
double-check makes a second one harmless), never missing.

After firing, the state lingers for ``linger_ms`` of watermark time, so that the
sink's answer and late copies of events still find it, then it is forgotten.
An object that never fired and has nothing due (a late duplicate of an object
already purged and forgotten, a feed record read after its object went, rows
removed without an event) would be kept for ever: after each of its events it
is kept for ``forget_after_ms`` of watermark time, then forgotten as one that
never fired (``on_events``). Whatever is forgotten while its row is still there,
a reconcile finds again.

Example::

    schedule = Schedule()
    next_timer(schedule, Eligibility("deleted", 1_000))   # 1000
    candidate, schedule = on_timer(schedule, Eligibility("deleted", 1_000), watermark_ms=1_500, linger_ms=600)
    candidate  # Eligibility(rule='deleted', eligible_at_ms=1000); the state is forgotten at 2100
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from purger.core.erasure import is_erasure
from purger.core.events import Eligibility


RECHECK_FIRED = "(fired)"


@dataclass(frozen=True)
class Schedule:
    # The timer registered with Spark, so a changed deadline can delete it.
    timer_ms: int | None = None
    # A recheck the sink asked for; once it fired, with none pending (no recheck_at_ms), RECHECK_FIRED: the
    # schedule's fields are the state's, which a checkpoint in Spark's unsaferow encoding keeps by position, so
    # "it was emitted" is said in a field there is, not a new one.
    recheck_rule: str | None = None
    recheck_at_ms: int | None = None
    # The own eligibility that was last emitted, so the same one is not emitted twice.
    fired_rule: str | None = None
    fired_at_ms: int | None = None
    # When the state is forgotten if nothing is due then: the end of the linger after firing, or, for an
    # object that never fired, ``forget_after_ms`` after its last event.
    linger_until_ms: int | None = None

    @property
    def never_fired(self) -> bool:
        """Never emitted, under its own eligibility or a recheck."""
        return self.fired_rule is None and self.recheck_rule is None

def _fired(schedule: Schedule, own: Eligibility) -> bool:
    return (schedule.fired_rule, schedule.fired_at_ms) == (own.rule, own.eligible_at_ms)


def due(schedule: Schedule, own: Eligibility | None) -> Eligibility | None:
    """The earliest reason to emit the object: a recheck, or its own eligibility not yet emitted."""
    options = []
    if schedule.recheck_at_ms is not None:
        options.append(Eligibility(schedule.recheck_rule or "", schedule.recheck_at_ms))
    if own is not None and not _fired(schedule, own):
        options.append(own)
    return min(options, key=lambda e: e.eligible_at_ms, default=None)


def next_timer(schedule: Schedule, own: Eligibility | None) -> int | None:
    """The one timer the object needs: its due time, else the end of its linger, else none."""
    when = due(schedule, own)
    if when is not None:
        return when.eligible_at_ms
    return schedule.linger_until_ms


def on_events(schedule: Schedule, own: Eligibility | None, watermark_ms: int, forget_after_ms: int) -> Schedule:
    """After an object's events (``own``: its eligibility now): one that never fired and has nothing due is
    kept until ``forget_after_ms`` past the watermark, each event putting that off."""
    if not schedule.never_fired:
        return schedule  # its linger runs from its firing
    nothing_due = due(schedule, own) is None
    return replace(schedule, linger_until_ms=watermark_ms + forget_after_ms if nothing_due else None)


def recheck(schedule: Schedule, rule: str, at_ms: int) -> Schedule:
    """Ask to look again at ``at_ms``. Of two pending rechecks the earlier stands, but an erasure's
    (``core.erasure``) stands over any other: it is what the purge of the object must be decided under."""
    pending = schedule.recheck_at_ms is not None
    if pending and is_erasure(schedule.recheck_rule) and not is_erasure(rule):
        return schedule
    if pending and schedule.recheck_at_ms <= at_ms and is_erasure(schedule.recheck_rule) >= is_erasure(rule):
        return schedule
    return replace(schedule, recheck_rule=rule, recheck_at_ms=at_ms)


def on_timer(
    schedule: Schedule, own: Eligibility | None, watermark_ms: int, linger_ms: int
) -> tuple[Eligibility | None, Schedule | None]:
    """The watermark reached the timer: the candidate to emit (or None), and the schedule to keep
    (None: forget the object; ``never_fired`` on the schedule given says whether it ever was a candidate)."""
    when = due(schedule, own)
    if when is not None and when.eligible_at_ms <= watermark_ms:
        own_due = own is not None and not _fired(schedule, own) and own.eligible_at_ms <= watermark_ms
        # An erasure asked for is what the object is purged under, whatever else makes it due first.
        recheck_due = schedule.recheck_at_ms is not None and (
            schedule.recheck_at_ms <= watermark_ms or (own_due and is_erasure(schedule.recheck_rule)))
        # A recheck carries the row's rule, which is better informed than the stream's own.
        emitted = Eligibility(schedule.recheck_rule or "", schedule.recheck_at_ms) if recheck_due else own
        kept = replace(
            schedule,
            recheck_rule=RECHECK_FIRED if recheck_due else schedule.recheck_rule,
            recheck_at_ms=None if recheck_due else schedule.recheck_at_ms,
            fired_rule=own.rule if own_due else schedule.fired_rule,
            fired_at_ms=own.eligible_at_ms if own_due else schedule.fired_at_ms,
            linger_until_ms=watermark_ms + linger_ms,
        )
        return emitted, kept
    if when is None and schedule.linger_until_ms is not None and schedule.linger_until_ms <= watermark_ms:
        return None, None
    return None, schedule
