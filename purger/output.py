"""What the command line prints, apart from the commands' parsing (``purger.cli``): one ``Output`` per run of a
command, ``TextOutput`` for a person (tables that read at 80 columns) or ``JsonOutput`` for a script (one JSON
document on stdout, what ``--json`` asks for), each with a method per command that prints.

Example::

    from purger.output import human_duration, output
    human_duration(856270.1)   # '9.9 d'
    output(as_json=False).report(date(2026, 11, 24), "ledger/records", rows)   # the report's tables
    output(as_json=True).submit_line(["spark-submit", "--master", "yarn", ...])   # {"command": [...], "line": ...}
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from abc import ABC, abstractmethod
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any, Iterable

import typer

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from purger.core.times import human_duration  # here too: what the command line prints

if TYPE_CHECKING:
    from purger.core.erasure import Certificate
    from purger.core.sizing import Sizing
    from purger.setup import Findings
    from purger.restore import Restored
    from purger.status import Status


def narrow_table(title: str | None = None, caption: str | None = None) -> Table:
    """A table with no vertical rules and one space between columns: the most columns in 80."""
    return Table(title=title, caption=caption, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                 padding=0, title_justify="left", caption_justify="left")


def figures_column(table: Table, header: str, values: Iterable[str]) -> None:
    """A right-aligned column of figures, never folded or cut: as wide as its widest value or header line."""
    width = max([len(v) for v in values] + [len(line) for line in header.splitlines()])
    table.add_column(header, justify="right", no_wrap=True, min_width=width)


def _by_policy(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        grouped.setdefault(r["policy"], []).append(r)
    return grouped


def report_tables(rows: list[dict[str, Any]], title: str) -> RenderableType:
    """The daily purge report's rows (``sinks.ledger.Report.rows``), a row per policy, kind and data centre
    (``all``: the objects' Cassandra rows), in a few narrow tables: the outcomes by status (a dry run's and a
    replay's statuses, and dead letters, only when there are some), the purge lag and the day's first and last
    decision, the skips by reason, and each policy's own fields. Reads at 80 columns."""
    from purger.core.vocabulary import ALREADY_GONE, DEAD_LETTERED, ERROR, PURGED, SKIPPED, WOULD_DELETE

    rows = [r if isinstance(r, dict) else r.asDict() for r in rows]
    grouped = _by_policy(rows)
    parts: list[RenderableType] = []

    def kind_column(table: Table) -> None:
        # The only column that may be folded, when a name is too long for what is left.
        table.add_column("policy / kind", overflow="fold")
        table.add_column("dc", no_wrap=True)

    def each_row(table: Table, cells) -> None:
        for policy, members in grouped.items():
            table.add_row(Text(policy, style="bold"))
            for r in members:
                table.add_row(f" {r['kind']}", r["dc"], *cells(r))

    statuses = [(PURGED, "purged"), (WOULD_DELETE, "would\ndelete"), (ALREADY_GONE, "already\ngone"),
                (SKIPPED, "skipped"), (ERROR, "errors"), (DEAD_LETTERED, "dead\nletters")]
    shown = [(s, h) for s, h in statuses
             if s in (PURGED, SKIPPED, ERROR) or any(r[s] for r in rows)]
    outcomes = narrow_table(title)
    kind_column(outcomes)
    figures_column(outcomes, "candidates", [str(r["candidates"]) for r in rows])
    for status, header in shown:
        figures_column(outcomes, header, [str(r[status]) for r in rows])
    each_row(outcomes, lambda r: [str(r["candidates"]), *(str(r[s]) for s, _ in shown)])
    parts.append(outcomes)

    def moment(value: datetime | None) -> str:
        return "-" if value is None else f"{value:%H:%M:%S}"

    lags = ("lag_p50_s", "lag_p95_s", "lag_p99_s")
    timing = narrow_table("Purge lag (eligible to deleted), first and last decision (UTC)")
    kind_column(timing)
    for lag in lags:
        figures_column(timing, lag[:-2].replace("_", " "), [human_duration(r[lag]) for r in rows])
    for header, figure in (("first", "started_at"), ("last", "finished_at")):
        figures_column(timing, header, [moment(r[figure]) for r in rows])
    figures_column(timing, "span", [human_duration(r["duration_s"]) for r in rows])
    each_row(timing, lambda r: [*(human_duration(r[lag]) for lag in lags), moment(r["started_at"]),
                                moment(r["finished_at"]), human_duration(r["duration_s"])])
    parts.append(timing)

    if any(r["skipped_by_reason"] for r in rows):
        skips = narrow_table("Skipped, by reason")
        skips.add_column("policy / kind", overflow="fold")
        skips.add_column("dc", no_wrap=True)
        skips.add_column("reason", overflow="fold")
        figures_column(skips, "skipped", [str(n) for r in rows for n in (r["skipped_by_reason"] or {}).values()])
        for policy, members in grouped.items():
            if any(r["skipped_by_reason"] for r in members):
                skips.add_row(Text(policy, style="bold"))
            for r in members:
                for reason, n in sorted((r["skipped_by_reason"] or {}).items()):
                    skips.add_row(f" {r['kind']}", r["dc"], reason, str(n))
        parts.append(skips)

    # The same for every row of a policy: once per policy.
    fields = {policy: members[0]["policy_fields"] for policy, members in grouped.items()
              if members[0]["policy_fields"]}
    if fields:
        own = narrow_table("Each policy's own report fields")
        own.add_column("policy / field", overflow="fold")
        own.add_column("value", overflow="fold")
        for policy, values in fields.items():
            own.add_row(Text(policy, style="bold"))
            for name, value in sorted(values.items()):
                own.add_row(f" {name.replace('_', ' ')}", value or "-")
        parts.append(own)
    spaced: list[RenderableType] = []
    for part in parts:
        spaced += [Text(""), part] if spaced else [part]
    return Group(*spaced)


def pending_table(rows: list[Any], title: str) -> Table:
    """What the checkpoint's state will purge (``streams.pending.pending_purges`` rows): a line per object,
    soonest first; a long id or hint is folded onto more lines, never cut. Reads at 80 columns."""
    table = narrow_table(title)
    table.add_column("due (UTC)", no_wrap=True, min_width=19)
    table.add_column("kind", no_wrap=True)
    table.add_column("id", overflow="fold")
    table.add_column("rule", overflow="fold")
    table.add_column("hint", overflow="fold")
    for r in rows:
        table.add_row(f"{r['due_at']:%Y-%m-%d %H:%M:%S}", r["kind"], r["id"], r["rule"], r["hint"] or "-")
    return table


def reconcile_table(rows: list[Any], title: str) -> Table:
    """A reconcile run's report (``purger.reconcile.verdict.ReportRow``), a line per policy, table and data centre:
    rows scanned, known to the stream, fed back as unknown or overdue, orphan blobs found and deleted, time
    and rate. Reads at 80 columns."""
    rows = [r if isinstance(r, dict) else r.__dict__ for r in rows]
    table = narrow_table(title, caption="fed: sent to the reconcile topic (a dry run sends nothing)")
    table.add_column("policy / table", overflow="fold")
    table.add_column("dc", no_wrap=True)
    figures = [("scanned", "scanned"), ("known", "known"), ("unknown_fed", "unknown\nfed"),
               ("overdue_fed", "overdue\nfed"), ("orphans_found", "orphans"), ("orphans_deleted", "orphans\ndeleted")]
    for name, header in figures:
        figures_column(table, header, [str(r[name]) for r in rows])
    figures_column(table, "took", [human_duration(r["duration_s"]) for r in rows])
    figures_column(table, "rows/s", [f"{r['rows_per_s']:.0f}" for r in rows])
    for policy, members in _by_policy(rows).items():
        table.add_row(Text(policy, style="bold"))
        for r in members:
            table.add_row(f" {r['table']}", r["dc"], *(str(r[name]) for name, _ in figures),
                          human_duration(r["duration_s"]), f"{r['rows_per_s']:.0f}")
    return table


def sizing_lines(sizing: Any) -> list[str]:
    """``purger setup --rate``'s estimate (``core.sizing.Sizing``): the load, the cores, then the settings as
    TOML to paste into the configuration."""
    volume = sizing.volume
    lines = [
        f"At {volume.messages_per_day:,.0f} messages a day ({volume.events_per_message:g} events and "
        f"{volume.payloads_per_message:g} stored payloads a message, {volume.retention_days:g} days in the state)"
        " (docs/sizing.md):",
        f"  {sizing.events_per_s:,.0f} events/s, {sizing.decisions_per_s:,.0f} decisions/s, "
        f"{sizing.paxos_rounds_per_s:,.0f} Paxos rounds/s at steady state "
        f"({sizing.paxos_rounds_at_cap_per_s:,.0f} at the cap)",
        f"  state: {sizing.state_rows:,.0f} rows, {sizing.state_bytes / 1e9:,.1f} GB on disk",
        f"  executor cores: {sizing.cores} (a day's backlog decided within 12 h, the reconcile at its cap)",
        "",
    ]
    sections: dict[str, list[str]] = {}
    for key, value in sizing.settings().items():
        section, name = key.split(".", 1)
        sections.setdefault(section, []).append(f"{name} = {value}")
    for section, settings in sections.items():
        lines += [f"[{section}]", *settings, ""]
    return lines


class Output(ABC):
    """What each command that prints shows: for a person (``TextOutput``) or a script (``JsonOutput``). A
    problem a command stops on is one line on stderr either way (and its exit code), never in the document."""

    @abstractmethod
    def setup(self, sizing: Sizing | None, findings: Findings) -> None:
        """``purger setup``: the volume's estimate (with ``--rate``), what was created and found in place, the
        problems, what the keyspace's replication asks of the platform's writes."""

    @abstractmethod
    def report(self, day: date, ledger_path: str, rows: list[Any]) -> None:
        """``purger report``: a day's rows (``sinks.ledger.Report.rows``)."""

    @abstractmethod
    def pending(self, rows: list[Any], within_s: float, checkpoint: str, watermark_delay: timedelta) -> None:
        """``purger pending``: what comes due within ``within_s`` (``streams.pending.pending_purges`` rows)."""

    @abstractmethod
    def reconcile(self, rows: list[Any], dry_run: bool) -> None:
        """``purger reconcile``: its report's rows (``purger.reconcile.verdict.ReportRow``)."""

    @abstractmethod
    def submit_line(self, command: list[str]) -> None:
        """``purger submit-line``: the spark-submit command."""

    @abstractmethod
    def status(self, status: Status) -> None:
        """``purger status``."""

    @abstractmethod
    def holds(self, holds: list[dict[str, Any]]) -> None:
        """``purger holds``: scope, reason, placed_by, placed_at, held_objects of each hold in force; then each
        release cut short (``release_cut_short``), with the objects it has not yet had looked at again."""

    @abstractmethod
    def ledger_records(self, object_id: str, ledger_path: str, records: list[dict[str, Any]]) -> None:
        """``purger ledger find``: an object's records, oldest first."""

    @abstractmethod
    def certificate(self, found: Certificate) -> None:
        """``purger erase``: the request's certificate (``purger.core.erasure.Certificate``)."""

    @abstractmethod
    def restored(self, done: Restored) -> None:
        """``purger restore``: each deletion put back or not, and the holds placed (``purger.restore.Restored``)."""


def output(as_json: bool) -> Output:
    return JsonOutput() if as_json else TextOutput()


class TextOutput(Output):
    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console()

    def setup(self, sizing: Sizing | None, findings: Findings) -> None:
        for line in sizing_lines(sizing) if sizing is not None else []:
            typer.echo(line)
        for line in findings.created:
            typer.echo(f"created {line}")
        for problem in findings.problems:
            typer.echo(problem, err=True)
        if findings.problems:
            return  # the command exits on them
        if not findings.created:
            typer.echo("nothing to create: the purger's own topics and tables exist")
        for line in findings.checked:
            typer.echo(f"in place on {line}")
        for line in findings.replication:
            typer.echo(line)

    def report(self, day: date, ledger_path: str, rows: list[Any]) -> None:
        title = f"Purge report {day.isoformat()} (UTC), from {ledger_path}"
        self.console.print(report_tables(rows, title) if rows else f"no ledger records for {day.isoformat()}")

    def pending(self, rows: list[Any], within_s: float, checkpoint: str, watermark_delay: timedelta) -> None:
        within = human_duration(within_s)
        title = (f"Due within {within}, from {checkpoint} (purged about {human_duration(watermark_delay)} after "
                 "due: stream.watermark_delay)")
        self.console.print(pending_table(rows, title) if rows else f"nothing due within {within}")

    def reconcile(self, rows: list[Any], dry_run: bool) -> None:
        title = (f"Reconcile of {', '.join(sorted({r.policy for r in rows})) or 'no policy'}"
                 + (" (dry run: nothing fed back or deleted)" if dry_run else ""))
        self.console.print(reconcile_table(rows, title) if rows else "no policy scans a table")

    def submit_line(self, command: list[str]) -> None:
        typer.echo(shlex.join(command))

    def status(self, status: Status) -> None:
        from purger.status import render

        self.console.print(render(status))

    def holds(self, holds: list[dict[str, Any]]) -> None:
        if not any(not hold["release_cut_short"] for hold in holds):
            typer.echo("no hold in force")
        for hold in holds:
            if hold["release_cut_short"]:
                typer.echo(f"{hold['scope']}  released, but its release stopped before {hold['held_objects']} held "
                           f"objects were looked at again: run `purger release {hold['scope']}` again")
            else:
                typer.echo(f"{hold['scope']}  {hold['held_objects']} held  since {hold['placed_at']} by "
                           f"{hold['placed_by']}: {hold['reason']}")

    def ledger_records(self, object_id: str, ledger_path: str, records: list[dict[str, Any]]) -> None:
        if not records:
            typer.echo(f"no ledger records of {object_id!r} in {ledger_path}")
        for r in records:
            typer.echo(f"{r['decided_at']:%Y-%m-%d %H:%M:%S}  {r['policy']}  {r['kind']}"
                       + (f" in {r['dc']}" if r["dc"] else "") + f"  {r['status']}  {r['rule'] or '-'}"
                       + (f"  {r['reason']}" if r["reason"] else "")
                       + f"  batch {r['batch_id']}  record {r['record_id'][:12]}")

    def certificate(self, found: Certificate) -> None:
        typer.echo(f"erasure {found.request} of {found.subject}: {len(found.deleted)} deleted, {len(found.kept)} "
                   f"kept, {len(found.gone)} gone before it" + (f", {len(found.pending)} not decided yet"
                                                                  if found.pending else ""))
        for e in found.deleted:
            typer.echo(f"  deleted  {e.kind} {e.id}" + (f" in {e.dc}" if e.dc else "")
                       + f"  at {e.at}  policies.{e.policy}  record {e.record_id}")
        for e in found.kept:
            typer.echo(f"  kept     {e.kind} {e.id}  {e.reason}  (record {e.record_id}; erased at its release)")
        for e in found.gone:
            typer.echo(f"  gone     {e.kind} {e.id}  removed by another writer before the erasure  "
                       f"(record {e.record_id})")
        for kind, object_id in found.pending:
            typer.echo(f"  pending  {kind} {object_id}")
        if found.images_removed or found.images_kept:
            typer.echo(f"undo window: {found.images_removed} images of the subject removed (rows and blob copies); "
                       f"those of {len(found.images_kept)} held objects kept")
        for e in found.images_kept:
            typer.echo(f"  kept     images of {e.kind} {e.id}  {e.reason}")

    def restored(self, done: Restored) -> None:
        typer.echo(f"restore {done.run}: {len(done.restored)} restored, {len(done.not_restored)} not, "
                   f"{len(done.held)} objects held until released (`purger release KIND:ID`)")
        for entry in restored_entries(done):
            typer.echo(f"  {entry['status']:<12} {entry['kind']} {entry['id']}"
                       + (f" in {entry['dc']}" if entry["dc"] else "") + f"  deleted at {entry['deleted_at']}"
                       + (f"  {entry['why']}" if entry["why"] else ""))


class JsonOutput(Output):
    """One JSON document on stdout: times in ISO 8601 (UTC), durations in seconds, ``null`` for what is not
    known; a list of rows, or an object for a command that says several things."""

    @staticmethod
    def _print(document: Any) -> None:
        typer.echo(json.dumps(document, default=json_value))

    def setup(self, sizing: Sizing | None, findings: Findings) -> None:
        estimate = None
        if sizing is not None:
            estimate = {**{k: v for k, v in dataclasses.asdict(sizing).items() if k != "volume"},
                        "volume": dataclasses.asdict(sizing.volume), "settings": sizing.settings()}
        self._print({"sizing": estimate, **dataclasses.asdict(findings)})
        for problem in findings.problems:
            typer.echo(problem, err=True)

    def report(self, day: date, ledger_path: str, rows: list[Any]) -> None:
        self._print([_row(r) for r in rows])

    def pending(self, rows: list[Any], within_s: float, checkpoint: str, watermark_delay: timedelta) -> None:
        self._print([_row(r) for r in rows])

    def reconcile(self, rows: list[Any], dry_run: bool) -> None:
        self._print([_row(r) for r in rows])

    def submit_line(self, command: list[str]) -> None:
        self._print({"command": command, "line": shlex.join(command)})

    def status(self, status: Status) -> None:
        from purger.status import as_json

        typer.echo(as_json(status))

    def holds(self, holds: list[dict[str, Any]]) -> None:
        self._print(holds)

    def ledger_records(self, object_id: str, ledger_path: str, records: list[dict[str, Any]]) -> None:
        self._print(records)

    def certificate(self, found: Certificate) -> None:
        self._print({**dataclasses.asdict(found), "complete": found.complete})

    def restored(self, done: Restored) -> None:
        self._print({"run": done.run, "held": done.held, "deletions": restored_entries(done)})


def restored_entries(done: Restored) -> list[dict[str, Any]]:
    """Each deletion a restore looked at: its id in clear where its image has it (the ledger's, else), never the
    image's contents."""
    from purger.core.times import format_epoch_ms
    from purger.core.vocabulary import NOT_RESTORED, RESTORED

    looked_at = [(d, RESTORED, None) for d in done.restored] + [(d, NOT_RESTORED, why) for d, why in done.not_restored]
    return [{"status": status, "kind": d.kind, "id": d.image.id if d.image is not None else d.id, "dc": d.dc,
             "rule": d.rule, "deleted_at": format_epoch_ms(d.deleted_at_ms), "why": why}
            for d, status, why in looked_at]


def _row(row: Any) -> dict[str, Any]:
    """A row as a dict: a Spark ``Row``, a dataclass or a dict."""
    if dataclasses.is_dataclass(row):
        return dataclasses.asdict(row)
    return row.asDict(recursive=True) if hasattr(row, "asDict") else dict(row)


def json_value(value: Any) -> Any:
    """What ``json.dumps`` cannot write itself, as every command's JSON writes it (``default=json_value``)."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"{type(value).__name__} is not JSON")
