"""Cassandra requests per purge decision, by outcome and by kind of request, beside the fewest a hand-written
loop needs for the same decision.

    python -m bench.requests --objects 200

The platform stand-ins write ``--objects`` objects of every kind for each
outcome: messages due (purged, then purged again: already gone), not yet due
and live; payloads unreferenced past their grace (purged, then already gone),
within it and referenced; rule events, users and units of work due (purged,
then already gone) and kept. Each is purged once by the purger's own
delete-time code as an executor builds it (``purger.sinks.clients``), and
every request its Cassandra session sends is counted by the driver's own hook
(``purger.connectors.request_counts``): lightweight transactions and serial
reads (each a Paxos round), plain reads, plain writes. The hand-written loop
makes the same decision, for messages and payloads, with the fewest
statements knowing the outcome in advance (an oracle: no real purger can), on
objects written the same way and counted by the same hook. Counts do not
depend on the machine's speed; the milliseconds per decision (one at a time)
are beside them for scale.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from bench.common import BenchRun
from purger.connectors import CassandraTables
from purger.connectors.request_counts import PAXOS_ROUNDS, REQUEST_KINDS, RequestCounts
from purger.core.purge_protocol import Attempt, Candidate
from purger.core.times import now_ms
from purger.core.vocabulary import ALREADY_GONE, PURGED, SKIPPED
from purger.policies.mailbox.deletes import DELETING, LIVE
from purger.policies.mailbox.rules import EXPIRED_BY_COUNTER, PAYLOAD as PAYLOAD_RULE
from purger.policies.mailbox.state import MESSAGE, PAYLOAD
from purger.policies.rule_events import COMPLETE, rule_name
from purger.policies.units_of_work import RETENTION
from purger.policies.users import USER_ABSENT
from purger.sinks.clients import executor_clients, executor_session
from simulation.clock import now
from simulation.mailbox import Platform
from simulation.policy_objects import SETTINGS, PolicyObjects

GRACE = timedelta(minutes=2)  # the mailbox's periods here: what is older is due, what is newer is not
RULES = {"rule_event": rule_name(COMPLETE), "user": USER_ABSENT, "unit_of_work": RETENTION}
COLUMNS = {"lightweight_transaction": "LWT", "serial_read": "serial", "plain_read": "read", "plain_write": "write"}


@dataclass(frozen=True)
class Case:
    """Objects of one kind meant to end one way, and the candidate the stream would emit for each."""

    kind: str
    outcome: str  # purged | already_gone | not_yet_due | live | referenced | kept
    candidates: list[Candidate]


def mailbox_cases(platform: Platform, refs_table: str, tag: str, n: int) -> list[Case]:
    long_ago, dcs = now() - 2 * GRACE, ["dc1", "dc2"]

    def message(m: str, p: str) -> Candidate:
        return Candidate(MESSAGE, m, EXPIRED_BY_COUNTER, now_ms(), {"payload_id": p, "inline": False, "dcs": dcs})

    due, not_due, live, stranded, recent, referenced = ([] for _ in range(6))
    for i in range(n):
        ids = [f"{tag}-{case}-{i}" for case in ("due", "soon", "live", "stranded", "recent", "referenced")]
        platform.enqueue(ids[0], f"p-{ids[0]}", extract_count=0, at=long_ago)
        platform.enqueue(ids[1], f"p-{ids[1]}", extract_count=0)
        platform.enqueue(ids[2], f"p-{ids[2]}", extract_count=1, at=long_ago)
        for payloads, m, at in ((stranded, ids[3], long_ago), (recent, ids[4], now())):
            platform.enqueue(m, f"p-{m}", at=at)
            platform.session.execute(f"DELETE FROM {refs_table} WHERE payload_id = %s", (f"p-{m}",))
            payloads.append(Candidate(PAYLOAD, f"p-{m}", PAYLOAD_RULE, now_ms(), {"dcs": dcs}))
        platform.enqueue(ids[5], f"p-{ids[5]}", at=long_ago)
        referenced.append(Candidate(PAYLOAD, f"p-{ids[5]}", PAYLOAD_RULE, now_ms(), {"dcs": dcs}))
        due.append(message(ids[0], f"p-{ids[0]}"))
        not_due.append(message(ids[1], f"p-{ids[1]}"))
        live.append(message(ids[2], f"p-{ids[2]}"))
    platform.flush()
    return [Case(MESSAGE, PURGED, due), Case(MESSAGE, ALREADY_GONE, due), Case(MESSAGE, "not_yet_due", not_due),
            Case(MESSAGE, "live", live), Case(PAYLOAD, PURGED, stranded), Case(PAYLOAD, ALREADY_GONE, stranded),
            Case(PAYLOAD, "not_yet_due", recent), Case(PAYLOAD, "referenced", referenced)]


def policy_cases(objects: PolicyObjects, tag: str, n: int) -> list[Case]:
    by: dict[tuple[str, bool], list[Candidate]] = defaultdict(list)
    for i in range(n):
        for o in objects.write(f"{tag}-{i}"):
            by[(o.kind, o.eligible)].append(Candidate(o.kind, o.id, RULES[o.kind], now_ms(), {}))
    objects.flush()
    return [case for kind in RULES for case in (
        Case(kind, PURGED, by[(kind, True)]), Case(kind, ALREADY_GONE, by[(kind, True)]),
        Case(kind, "kept", by[(kind, False)]))]


def ended(outcomes: list[Any]) -> str:
    """The object's own outcome (the last; dependents name themselves)."""
    mine = [o for o in outcomes if o.kind is None]
    return mine[-1].status if mine else "none"


def measure(counts: RequestCounts, decide: Callable[[Candidate], str], case: Case,
            task_end: Callable[[], None] = lambda: None) -> tuple[Counter[str], float, Counter[str]]:
    """Requests per decision by kind, milliseconds per decision, and the outcomes seen. ``task_end`` is timed
    with the decisions, as a task's end is (the purger's: the blobs left in case, sent together)."""
    counts.taken()
    seen: Counter[str] = Counter()
    started = time.perf_counter()
    for candidate in case.candidates:
        seen[decide(candidate)] += 1
    task_end()
    elapsed_ms = (time.perf_counter() - started) * 1000
    taken = counts.taken()
    n = len(case.candidates)
    return Counter({kind: taken[kind] / n for kind in REQUEST_KINDS}), elapsed_ms / n, seen


class HandLoop:
    """The fewest statements that reach each mailbox decision, the outcome known in advance."""

    def __init__(self, session: Any, config: Any) -> None:
        mailbox = config.policy_set.policy_of(MESSAGE)
        tables = CassandraTables(session, config.cassandra.keyspace, mailbox.table_names())
        self.tables, prepare = tables, tables.prepare
        self.cutoff = mailbox.retention.message_rules[EXPIRED_BY_COUNTER].cutoff
        self.read = prepare("SELECT * FROM {messages} WHERE message_id = ?")
        self.delete = prepare("DELETE FROM {messages} WHERE message_id = ? IF extract_count = 0 AND updated_at <= ?")
        self.delete_ref = prepare("DELETE FROM {payload_refs} WHERE payload_id = ? AND message_id = ?")
        self.refs = prepare("SELECT message_id FROM {payload_refs} WHERE payload_id = ? LIMIT 1")
        self.read_payload = prepare("SELECT state, last_ref_at FROM {payloads} WHERE payload_id = ?")
        self.claim = prepare(f"UPDATE {{payloads}} SET state = '{DELETING}' WHERE payload_id = ? "
                             f"IF state = '{LIVE}' AND last_ref_at = ?")
        self.delete_payload = prepare(f"DELETE FROM {{payloads}} WHERE payload_id = ? IF state = '{DELETING}'")

    def decide(self, case: Case) -> Callable[[Candidate], str]:
        t = self.tables
        if case.kind == MESSAGE and case.outcome == PURGED:
            def purge(c: Candidate) -> str:  # the delete, the reference, and whether another refers
                applied = t.applied(self.delete, c.id, self.cutoff())
                t.execute(self.delete_ref, c.hint["payload_id"], c.id)
                t.all(self.refs, c.hint["payload_id"])
                return PURGED if applied else SKIPPED
            return purge
        if case.kind == MESSAGE:
            return lambda c: ALREADY_GONE if t.one(self.read, c.id) is None else SKIPPED
        if case.outcome == "referenced":
            return lambda c: SKIPPED if t.all(self.refs, c.id) else PURGED
        if case.outcome == PURGED:
            def purge_payload(c: Candidate) -> str:  # no reference, the row, the claim, the blobs, the row
                t.all(self.refs, c.id)
                row = t.one(self.read_payload, c.id)
                t.applied(self.claim, c.id, row.last_ref_at)
                return PURGED if t.applied(self.delete_payload, c.id) else SKIPPED
            return purge_payload
        return lambda c: ALREADY_GONE if t.one(self.read_payload, c.id) is None else SKIPPED


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=200, help="objects per kind and outcome")
    args = parser.parse_args()
    grace = f"{int(GRACE.total_seconds())}s"
    run = BenchRun.start("requests", policies={
        "mailbox": {"expired_ttl": grace, "payload_grace": grace, "deleted_ttl": grace}, **SETTINGS})
    config = run.config
    clients = executor_clients(config)
    session = executor_session(config)
    counts = RequestCounts.attach(session)
    platform, objects = Platform(config), PolicyObjects(config)
    refs_table = config.policy_set.policy_of(MESSAGE).settings.payload_refs_table
    cases = (mailbox_cases(platform, refs_table, run.run, args.objects)
             + policy_cases(objects, run.run, args.objects))
    hand_by = {(c.kind, c.outcome): c for c in mailbox_cases(platform, refs_table, f"{run.run}-hand", args.objects)}
    hand = HandLoop(session, config)
    attempt = Attempt(batch=f"bench/{run.run}")
    print(f"\n{'kind':<13}{'outcome':<13}{'by':<7}" + "".join(f"{COLUMNS[k]:>7}" for k in REQUEST_KINDS)
          + f"{'Paxos':>7}{'ms':>7}  seen")
    for case in cases:
        rows = [("purger", lambda c: ended(list(clients.purges[c.kind].purge(c, attempt))), case, clients.flush)]
        if (case.kind, case.outcome) in hand_by:
            mirror = hand_by[(case.kind, case.outcome)]
            rows.append(("hand", hand.decide(mirror), mirror, lambda: None))
        for by, decide, measured, task_end in rows:
            per, ms, seen = measure(counts, decide, measured, task_end)
            paxos = sum(per[k] for k in PAXOS_ROUNDS)
            print(f"{case.kind:<13}{case.outcome:<13}{by:<7}" + "".join(f"{per[k]:>7.2f}" for k in REQUEST_KINDS)
                  + f"{paxos:>7.2f}{ms:>7.2f}  {dict(seen)}", flush=True)
            run.record(f"{by}: {case.kind} {case.outcome}, Paxos rounds per decision", paxos, "rounds",
                       requests={k: round(per[k], 3) for k in REQUEST_KINDS}, ms_per_decision=round(ms, 3),
                       outcomes=dict(seen), objects=len(measured.candidates))
    counts.detach()
    platform.close()
    objects.close()


if __name__ == "__main__":
    main()
