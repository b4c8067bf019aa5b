"""What the command line prints reads at 80 columns: the purge report, the demo's table, the pending purges, and
durations as a person reads them."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone

import pytest

from purger.output import JsonOutput, TextOutput, human_duration, pending_table, report_tables
from tests.support.screens import at_80


@pytest.mark.parametrize("seconds, shown", [
    (856270.1, "9.9 d"), (3.2 * 3600, "3.2 h"), (14, "14 s"), (0.85, "850 ms"), (0, "0 s"), (0.0004, "0.4 ms"), (2.0, "2 s"),
    (2.345, "2.3 s"), (90, "1.5 min"), (59.99, "1 min"), (31654486, "366 d"), (-3, "-3 s"), (None, "-"),
    (timedelta(hours=36), "1.5 d"),
])
def test_durations_read_as_a_person_reads_them(seconds, shown):
    assert human_duration(seconds) == shown


def row(policy: str, kind: str, dc: str = "all", **figures) -> dict:
    started = datetime(2026, 11, 24, 8, 54, 45)
    return {"date": started.date(), "policy": policy, "kind": kind, "dc": dc, "candidates": 0, "purged": 0,
            "would_delete": 0, "already_gone": 0, "skipped": 0, "error": 0, "dead_lettered": 0,
            "skipped_by_reason": {}, "lag_p50_s": None, "lag_p95_s": None, "lag_p99_s": None,
            "started_at": started, "finished_at": started + timedelta(hours=9), "duration_s": 9 * 3600,
            "policy_fields": {}, **figures}


# The demo's rows, with every status and the longest names of the built-in policies.
ROWS = [
    row("engine", "dead_letter", candidates=1008, dead_lettered=1008),
    row("mailbox", "message", candidates=1234567, purged=1200000, would_delete=12, already_gone=34,
        skipped=567, error=1, skipped_by_reason={"live": 500, "not yet due": 67},
        lag_p50_s=23.27, lag_p95_s=3.2 * 3600, lag_p99_s=856270.1),
    row("mailbox", "payload", "dc1", candidates=20, purged=20, lag_p50_s=0.85, lag_p95_s=14, lag_p99_s=39.2),
    row("mailbox", "payload", "dc2", candidates=20, purged=20, lag_p50_s=28.4, lag_p95_s=38.2, lag_p99_s=39.2),
    row("units_of_work", "uow_object", candidates=15, purged=15, lag_p50_s=31654486.0, lag_p95_s=31654486.0,
        lag_p99_s=31654486.0,
        policy_fields={"archived_dependent_journey_types": "PAYMENT,RECALL,BULK,BATCH",
                       "retention_lower_bound": "2024-11-24T00:00:00.000Z", "execution_date": "2026-11-24"}),
    row("users", "mailbox_permission", candidates=6, purged=6, lag_p50_s=88.6, lag_p95_s=88.7, lag_p99_s=88.7),
]


def test_the_purge_report_reads_at_80_columns_with_every_figure_whole():
    lines = at_80(report_tables(ROWS, "Purge report 2026-11-24 (UTC), from /var/lib/purger/ledger/records"))
    text = "\n".join(lines)
    message = next(line for line in lines if line.split()[:2] == ["message", "all"])
    assert message.split()[2:] == ["1234567", "1200000", "12", "34", "567", "1", "0"], text
    timing = [line for line in lines if line.split()[:2] == ["message", "all"]][1]
    assert timing.split()[2:] == ["23", "s", "3.2", "h", "9.9", "d", "08:54:45", "17:54:45", "9", "h"], text
    assert "366 d" in text and "850 ms" in text
    for reason in ("live", "not yet due"):
        assert any(line.split()[:3] == ["message", "all", *reason.split()[:1]] for line in lines), text
    assert "2024-11-24T00:00:00.000Z" in text and "PAYMENT,RECALL,BULK,BATCH" in text
    # The longest kind, whole, beside its figures, even with every status shown.
    assert any(line.split()[:3] == ["mailbox_permission", "all", "6"] for line in lines), text


def test_a_report_without_a_dry_run_replay_or_dead_letters_leaves_their_columns_out():
    text = "\n".join(at_80(report_tables(ROWS[2:4], "Purge report")))
    assert "purged" in text and "skipped" in text and "errors" in text
    assert "would" not in text and "already" not in text and "letters" not in text
    assert "Skipped, by reason" not in text and "own report fields" not in text


def test_pending_purges_read_at_80_columns_with_long_ids_folded_not_cut():
    long_id = "0123456789abcdef" * 4
    rows = [{"due_at": datetime(2026, 11, 24, 9, 0), "kind": "message", "id": long_id, "rule": "expired by counter",
             "hint": '{"payload_id": "p-0123456789abcdef0123456789abcdef", "dcs": ["dc1", "dc2"]}'}]
    lines = at_80(pending_table(rows, "Due within 1 d, from checkpoints/purger"))
    header = next(line for line in lines if line.startswith("due (UTC)"))
    ids = slice(header.index(" id ") + 1, header.index(" rule "))
    assert "".join(line[ids].strip() for line in lines[lines.index(header) + 2:]) == long_id


def test_the_demos_table_reads_at_80_columns():
    from devstack.__main__ import demo_table
    from simulation.demo import DemoReport

    report = DemoReport(scenarios={"expired by counter": (2100, 2100), "live": (1000, 1000)},
                        objects={"units_of_work: unit_of_work objects purged": (300, 300)},
                        payloads_expected_gone=2000, payloads_gone=2000, payloads_expected_kept=2000,
                        payloads_kept=2000, blobs_left={"dc1": 0, "dc2": 0}, seconds=856.3)
    lines = at_80(demo_table(report, 20000))
    assert "Purge demo: 20000 messages, 14 min" in lines[0]
    assert any(line.split()[-2:] == ["300", "300"] for line in lines)


# --- --json: one document a script parses ---------------------------------------------------------------


def printed_json(capsys, show) -> object:
    show(JsonOutput())
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one document, one line
    return json.loads(out)


def test_each_command_prints_one_json_document_with_times_in_iso_and_every_figure(capsys):
    from purger.core.sizing import Volume, size
    from purger.reconcile.verdict import ReportRow
    from purger.setup import Findings

    report = printed_json(capsys, lambda out: out.report(date(2026, 11, 24), "ledger/records", ROWS))
    assert [(r["policy"], r["kind"], r["dc"], r["purged"]) for r in report] == [
        (r["policy"], r["kind"], r["dc"], r["purged"]) for r in ROWS]
    assert report[1]["started_at"] == "2026-11-24T08:54:45" and report[1]["skipped_by_reason"]["live"] == 500

    due = {"due_at": datetime(2026, 11, 24, 9, 0), "kind": "message", "id": "m1", "rule": "deleted", "hint": None}
    assert printed_json(capsys, lambda out: out.pending([due], 3600, "checkpoints/purger", timedelta(seconds=30))) \
        == [{**due, "due_at": "2026-11-24T09:00:00"}]

    started = datetime(2026, 11, 24, 9, 0, tzinfo=timezone.utc)
    scanned = ReportRow("r1", "mailbox", "messages", "all", started, scanned=8, known=1).finish()
    [row] = printed_json(capsys, lambda out: out.reconcile([scanned], dry_run=False))
    assert (row["policy"], row["table"], row["scanned"], row["known"], row["run_id"]) == ("mailbox", "messages", 8, 1,
                                                                                          "r1")
    assert row["started"] == "2026-11-24T09:00:00+00:00" and row["duration_s"] > 0

    sizing = size(Volume(20e6))
    found = Findings(created=["Kafka 127.0.0.1:9092: topic purger.control"], checked=["Cassandra 127.0.0.1:9042"])
    setup = printed_json(capsys, lambda out: out.setup(sizing, found))
    assert setup["created"] == found.created and setup["checked"] == found.checked and setup["problems"] == []
    assert setup["sizing"]["cores"] == sizing.cores and setup["sizing"]["volume"]["messages_per_day"] == 20e6
    assert setup["sizing"]["settings"] == sizing.settings()
    assert printed_json(capsys, lambda out: out.setup(None, Findings()))["sizing"] is None

    assert printed_json(capsys, lambda out: out.submit_line(["spark-submit", "--name", "purger job"])) == {
        "command": ["spark-submit", "--name", "purger job"], "line": "spark-submit --name 'purger job'"}

    hold = {"scope": "mailbox:alice", "reason": "case 43", "placed_by": "jdoe", "placed_at": "2026-11-24 09:00:00",
            "held_objects": 3, "release_cut_short": False}
    assert printed_json(capsys, lambda out: out.holds([hold])) == [hold]

    record = {"decided_at": datetime(2026, 11, 24, 9, 0, 1), "policy": "mailbox", "kind": "message", "dc": None,
              "status": "purged", "rule": "deleted", "reason": None, "deleted_at": datetime(2026, 11, 24, 9, 0, 1),
              "batch_id": 7, "record_id": "ab" * 32}
    [found_record] = printed_json(capsys, lambda out: out.ledger_records("m1", "ledger/records", [record]))
    assert found_record == {**record, "decided_at": "2026-11-24T09:00:01", "deleted_at": "2026-11-24T09:00:01"}


def test_a_problem_goes_to_stderr_as_a_line_in_either_output(capsys):
    from purger.setup import Findings

    problem = "Kafka 127.0.0.1:9092: events topic events (kafka.topics) does not exist"
    for out in (TextOutput(), JsonOutput()):
        out.setup(None, Findings(problems=[problem]))
        printed = capsys.readouterr()
        assert printed.err.splitlines() == [problem]
        assert problem not in printed.out or isinstance(out, JsonOutput)  # the document says it, for a script


def test_the_text_of_holds_and_ledger_records_is_a_line_each(capsys):
    TextOutput().holds([])
    TextOutput().holds([{"scope": "mailbox:alice", "reason": "case 43", "placed_by": "jdoe",
                         "placed_at": "2026-11-24 09:00:00", "held_objects": 3, "release_cut_short": False},
                        {"scope": "user:bob", "reason": None, "placed_by": None, "placed_at": None,
                         "held_objects": 2, "release_cut_short": True}])
    TextOutput().ledger_records("m1", "ledger/records", [])
    TextOutput().ledger_records("m1", "ledger/records", [{
        "decided_at": datetime(2026, 11, 24, 9, 0, 1), "policy": "mailbox", "kind": "payload", "dc": "dc2",
        "status": "skipped", "rule": "deleted", "reason": "held", "deleted_at": None, "batch_id": 7,
        "record_id": "ab" * 32}])
    assert capsys.readouterr().out.splitlines() == [
        "no hold in force",
        "mailbox:alice  3 held  since 2026-11-24 09:00:00 by jdoe: case 43",
        "user:bob  released, but its release stopped before 2 held objects were looked at again: run "
        "`purger release user:bob` again",
        "no ledger records of 'm1' in ledger/records",
        "2026-11-24 09:00:01  mailbox  payload in dc2  skipped  deleted  held  batch 7  record abababababab"]
