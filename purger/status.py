"""`purger status`: one screen that says whether the purger is healthy, from what exists.

Each source is read on its own, so that one missing never hides the others:

- the running purger's metrics endpoint (``metrics.host`` and ``metrics.port`` on the driver): whether its query
  runs, since when;
- the checkpoint (``stream.checkpoint_location``): Spark's commit and offset logs give the last committed
  batch, its duration, the watermark after it, and a later batch planned but not committed;
- the ledger (``ledger.path``), today's partition: the day's outcomes by policy, as the daily report counts
  them (``Report.compute``), and the purge lag of the last hour's deletions;
- the reconcile report (``ledger.reconcile_path``): the last run's counts by policy;
- a Prometheus that scrapes the purger, when given: its purger alerts (``/api/v1/alerts``). Without one,
  the facts the main alerts are about, judged by nothing here: the thresholds are the rules'
  (deploy/prometheus/purger-rules.yml), in PromQL that only Prometheus evaluates.

What it could not read is one line each in ``Status.unread``, naming the path or address and what to do.

Example::

    status = gather(spark, config, prometheus_url="http://prometheus.internal:9090")
    Console().print(render(status))      # reads at 80 columns
    print(as_json(status))
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from purger.core.settings import PurgerConfig
from purger.core.times import from_epoch_ms, human_duration
from purger.core.vocabulary import ALREADY_GONE, DEAD_LETTERED, ERROR, PURGED, SKIPPED, STATUSES, WOULD_DELETE
from purger.output import figures_column, json_value, narrow_table
from purger.sinks.failures import STUCK_AFTER_MS, CassandraFailures, Stuck

if TYPE_CHECKING:  # Spark loads when the command reads
    from pyspark.sql import SparkSession

T = TypeVar("T")

# A status is asked for by a person or a script waiting on it: an endpoint that does not answer in this
# long is reported as such.
HTTP_TIMEOUT_S = 3
# The rules' alerts are all named so (deploy/prometheus/purger-rules.yml); a Prometheus holds others too.
ALERT_PREFIX = "Purger"


class Unreadable(Exception):
    """A source that could not be read, as the one line that says which and what to do."""


@dataclass
class Query:
    """From the metrics endpoint: ``running`` is the query's, not the process's."""

    running: bool
    since: datetime | None  # its last start


@dataclass
class Batch:
    """The last committed batch, from the checkpoint's logs."""

    id: int
    committed_at: datetime
    duration_s: float | None  # from its trigger to its commit
    watermark: datetime | None  # after it; None before any event time
    planned: int | None = None  # a later batch in the offsets log and not committed: under way, or cut by a stop
    planned_at: datetime | None = None


@dataclass
class Lags:
    """The purge lag of the deletions decided in the last hour, from the ledger."""

    deletions: int
    percentiles_s: dict[str, float | None]  # "p50", "p95", "p99" (sinks.ledger.LAG_PERCENTILES)


@dataclass
class Reconciled:
    """The last reconcile recorded at ``ledger.reconcile_path``; counts by policy."""

    run_id: str
    started: datetime
    finished: datetime
    dry_run: bool
    by_policy: dict[str, dict[str, int]]  # scanned, unknown_fed, overdue_fed, orphans_found


@dataclass
class Alert:
    name: str
    state: str  # firing or pending
    severity: str
    summary: str
    since: datetime | None


@dataclass
class HeldScope:
    """A legal hold in force (``purger.core.holds``) and how many objects it keeps now; or
    (``release_cut_short``) a hold lifted by a release that stopped before the objects it kept were looked at
    again, which ``purger release`` run again finishes."""

    scope: str
    reason: str
    placed_by: str
    placed_at: datetime | None
    held_objects: int
    release_cut_short: bool = False


@dataclass
class Status:
    at: datetime
    checkpoint: str
    ledger: str
    reconcile_interval_s: float  # 0: no schedule
    prometheus: str | None = None
    query: Query | None = None
    batch: Batch | None = None
    today: dict[str, dict[str, int]] | None = None  # policy -> status -> records
    lags: Lags | None = None
    reconcile: Reconciled | None = None
    alerts: list[Alert] | None = None  # None: no Prometheus asked, or it did not answer
    holds: list[HeldScope] | None = None
    stuck: list[Stuck] | None = None  # failing for over an hour, longest first
    unread: list[str] = field(default_factory=list)


# --- reading --------------------------------------------------------------------------------------------


def gather(spark: SparkSession, config: PurgerConfig, metrics_url: str | None = None, prometheus_url: str | None = None,
           at: datetime | None = None) -> Status:
    """Read every source (``metrics_url`` by default the local driver's, ``metrics.url``); what could not be read
    is a line in ``unread``, and the rest is still read."""
    from purger.sinks.ledger import use_s3a

    at = at or datetime.now(timezone.utc)
    status = Status(at, config.stream.checkpoint_location, config.ledger.path,
                    config.reconcile.interval.total_seconds(), prometheus_url)
    metrics_url = metrics_url or config.metrics.url
    if metrics_url is None:
        status.unread.append("metrics endpoint: off (metrics.port = 0), so whether the query runs is unknown: "
                             "give --metrics with the running purger's endpoint")
    else:
        status.query = _attempt(status.unread, f"metrics endpoint {metrics_url}", lambda: read_query(metrics_url))
    if prometheus_url:
        status.alerts = _attempt(status.unread, f"Prometheus {prometheus_url}", lambda: read_alerts(prometheus_url))
    # An s3a:// checkpoint, ledger or report is reached as the running purger reaches it (ledger.s3).
    use_s3a(spark, config.ledger)
    status.batch = _attempt(status.unread, f"checkpoint {status.checkpoint}",
                            lambda: read_checkpoint(spark, status.checkpoint))
    today = _attempt(status.unread, f"ledger {status.ledger}", lambda: read_ledger(spark, config, at))
    if today is not None:
        status.today, status.lags = today
    status.reconcile = _attempt(status.unread, f"reconcile report {config.ledger.reconcile_path}",
                                lambda: read_reconcile(spark, config))
    cassandra = config.cassandra
    status.holds = _attempt(status.unread, f"holds table {cassandra.keyspace}.{cassandra.holds_table}",
                            lambda: read_holds(config))
    status.stuck = _attempt(status.unread, f"failures table {cassandra.keyspace}.{cassandra.failures_table}",
                            lambda: read_stuck(config, at))
    return status


def _attempt(unread: list[str], source: str, read: Callable[[], T]) -> T | None:
    try:
        return read()
    except Unreadable as problem:
        unread.append(str(problem))
    except Exception as error:  # whatever else went wrong is one line too: the other sources are still shown
        unread.append(f"{source} could not be read: {_first_line(error)}")
    return None


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _get(url: str) -> bytes:
    """The body at ``url``; ``Unreadable`` when nothing answers, naming the address and why."""
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as answer:
            return answer.read()
    except (OSError, ValueError) as error:  # URLError and timeouts are OSErrors; ValueError: not a URL
        raise Unreadable(f"{url} did not answer ({getattr(error, 'reason', error)})") from None


def read_query(url: str) -> Query:
    """Whether the query of the purger serving ``url`` (its ``/metrics``) runs, and since when."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        body = _get(url)
    except Unreadable as problem:
        raise Unreadable(f"metrics endpoint {problem}: whether the query runs is unknown; start the purger "
                         "(purger run), or give --metrics http://<driver>:<metrics.port>/metrics") from None
    samples = {s.name: s.value for family in text_string_to_metric_families(body.decode()) for s in family.samples}
    if "purger_query_active" not in samples:
        raise Unreadable(f"metrics endpoint {url} has no purger_query_active: it is not a purger's; give "
                         "--metrics with the purger driver's metrics.port")
    started = samples.get("purger_query_started_timestamp_seconds")
    return Query(samples["purger_query_active"] == 1,
                 datetime.fromtimestamp(started, timezone.utc) if started else None)


def read_alerts(url: str) -> list[Alert]:
    """The purger's alerts firing or pending in the Prometheus at ``url`` (its HTTP API)."""
    api = f"{url.rstrip('/')}/api/v1/alerts"
    try:
        answer = json.loads(_get(api))
    except Unreadable as problem:
        raise Unreadable(f"Prometheus {problem}: check --prometheus (or PURGER_PROMETHEUS_URL)") from None
    except ValueError:
        raise Unreadable(f"Prometheus {api} answered with no JSON: is --prometheus a Prometheus?") from None
    return purger_alerts(answer)


def purger_alerts(answer: dict[str, Any]) -> list[Alert]:
    """The purger's alerts in an answer of Prometheus's ``/api/v1/alerts``, firing ones first."""
    alerts = [
        Alert(a["labels"]["alertname"], a["state"], a["labels"].get("severity", ""),
              a.get("annotations", {}).get("summary", ""),
              datetime.fromisoformat(a["activeAt"].replace("Z", "+00:00")) if a.get("activeAt") else None)
        for a in answer["data"]["alerts"] if a["labels"].get("alertname", "").startswith(ALERT_PREFIX)
    ]
    return sorted(alerts, key=lambda a: (a.state != "firing", a.name))


def read_holds(config: PurgerConfig) -> list[HeldScope]:
    """The legal holds in force, from the holds table (``cassandra.holds_table``)."""
    from purger.holds import HoldRefused, holds_in_force, releases_cut_short

    try:
        found, cut_short = holds_in_force(config), releases_cut_short(config)
    except HoldRefused as refused:
        raise Unreadable(str(refused)) from None
    return [HeldScope(hold.scope, hold.reason, hold.placed_by,
                      from_epoch_ms(hold.placed_at_ms) if hold.placed_at_ms is not None else None, count)
            for hold, count in found] + [HeldScope(scope, "", "", None, count, release_cut_short=True)
                                         for scope, count in cut_short]


def read_stuck(config: PurgerConfig, at: datetime) -> list[Stuck]:
    """The objects whose purge has failed for over an hour and is still retried (``cassandra.failures_table``)."""
    from purger.connectors import cassandra_session

    session = cassandra_session(config.cassandra)
    try:
        return CassandraFailures.of(session, config).stuck(int(at.timestamp() * 1000), STUCK_AFTER_MS)
    finally:
        session.cluster.shutdown()


def read_checkpoint(spark: SparkSession, location: str) -> Batch:
    """The checkpoint's last committed batch, read with Hadoop's filesystem (a local path, s3a://, ...)."""
    from purger.streams.checkpoint import CheckpointFiles

    files = CheckpointFiles(spark, location)
    if not files.exists():
        raise Unreadable(f"checkpoint {location} does not exist: no purger has run with this stream.checkpoint "
                         "(purger run makes it); check the path")
    commits, offsets = files.log("commits"), files.log("offsets")
    if not commits:
        raise Unreadable(f"checkpoint {location} has no committed batch yet: the purger's first batch has not "
                         "finished")
    last = max(commits)
    planned = max(offsets, default=last)
    return last_batch(last, files.text(commits[last]), commits[last].getModificationTime(),
                      files.text(offsets[last]) if last in offsets else None,
                      (planned, offsets[planned].getModificationTime()) if planned > last else None)


def last_batch(batch_id: int, commit: str, committed_ms: int, offsets: str | None,
               planned: tuple[int, int] | None) -> Batch:
    """A batch from its files in Spark's logs: the commit (``v1``, then ``{"nextBatchWatermarkMs": ...}``) and
    its modification time; the offsets (``v1``, the batch's metadata with ``batchTimestampMs``, its trigger
    time, then the sources' offsets); ``planned``: a later batch's id and offsets file time, if uncommitted."""
    watermark_ms = json.loads(commit.splitlines()[1]).get("nextBatchWatermarkMs") or 0
    started_ms = json.loads(offsets.splitlines()[1]).get("batchTimestampMs") if offsets else None
    return Batch(batch_id, from_epoch_ms(committed_ms),
                 (committed_ms - started_ms) / 1000 if started_ms else None,
                 from_epoch_ms(watermark_ms) if watermark_ms else None,
                 *((planned[0], from_epoch_ms(planned[1])) if planned else (None, None)))


def read_ledger(spark: SparkSession, config: PurgerConfig, at: datetime) -> tuple[dict[str, dict[str, int]], Lags]:
    """Today's outcomes by policy and status, and the last hour's purge lag: from today's partition (and
    yesterday's, in the day's first hour) only."""
    from pyspark.sql import functions as F

    from purger.sinks.ledger import LAG_PERCENTILES, Ledger, Report

    ledger = Ledger(spark, config.ledger)
    if not ledger.exists():
        raise Unreadable(f"ledger {config.ledger.path} does not exist: purger run makes it at its start; check "
                         "ledger.path")
    outcomes = outcomes_by_policy(Report(spark, config.ledger, config.policy_set).compute(at.date()).collect())
    since = at - timedelta(hours=1)
    recent = ledger.records().where((F.col("date") >= F.lit(since.date())) & (F.col("decided_at") >= F.lit(since))
                                    & (F.col("status") == PURGED))
    deletions, lags = recent.agg(F.count(F.lit(1)),
                                 F.percentile("lag_s", F.array(*(F.lit(p) for p in LAG_PERCENTILES)))).first()
    return outcomes, Lags(deletions, {f"p{int(p * 100)}": (lags[i] if lags else None)
                                      for i, p in enumerate(LAG_PERCENTILES)})


def outcomes_by_policy(rows: Iterable[Any]) -> dict[str, dict[str, int]]:
    """The daily report's rows (per policy, kind and data centre) summed by policy: records by status."""
    totals: dict[str, dict[str, int]] = {}
    for row in rows:
        counts = totals.setdefault(row["policy"], dict.fromkeys(STATUSES, 0))
        for each in STATUSES:
            counts[each] += row[each]
    return dict(sorted(totals.items()))


RECONCILE_COUNTS = ("scanned", "unknown_fed", "overdue_fed", "orphans_found")


def read_reconcile(spark: SparkSession, config: PurgerConfig) -> Reconciled:
    """The last reconcile recorded (a dry run's when the configuration is one, as the schedule counts them:
    ``purger.reconcile.run.last_reconcile_finished_s``)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    path = config.ledger.reconcile_path
    if not DeltaTable.isDeltaTable(spark, path):
        raise Unreadable(f"reconcile report {path} does not exist: no reconcile has run; run purger reconcile, or "
                         "let the running purger's schedule (reconcile.interval) run one")
    runs = spark.read.format("delta").load(path).where(F.coalesce("dry_run", F.lit(False)) == config.stream.dry_run)
    last = runs.orderBy(F.desc("finished")).select("run_id").first()
    if last is None:
        raise Unreadable(f"reconcile report {path} holds only " + ("real runs, no dry run's: run purger reconcile "
                         "--dry-run" if config.stream.dry_run else "dry runs: run purger reconcile"))
    return last_reconcile(runs.where(F.col("run_id") == last["run_id"]).collect())


def last_reconcile(rows: list[Any]) -> Reconciled:
    """A reconcile run from its report rows (``purger.reconcile.run.REPORT_SCHEMA``), summed by policy."""
    by_policy: dict[str, dict[str, int]] = {}
    for row in rows:
        counts = by_policy.setdefault(row["policy"], dict.fromkeys(RECONCILE_COUNTS, 0))
        for each in RECONCILE_COUNTS:
            counts[each] += row[each]
    return Reconciled(rows[0]["run_id"], min(_utc(r["started"]) for r in rows), max(_utc(r["finished"]) for r in rows),
                      bool(rows[0]["dry_run"]), dict(sorted(by_policy.items())))


def _utc(moment: datetime) -> datetime:
    # PySpark gives a timestamp as a naive datetime in this process's local time, which timestamp() reads.
    return datetime.fromtimestamp(moment.timestamp(), timezone.utc)


# --- what it prints ---------------------------------------------------------------------------------------


def _clock(moment: datetime) -> str:
    """A moment as the screen shows it, to the second; status's moments are all UTC."""
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def _moment(moment: datetime, at: datetime) -> str:
    return f"{_clock(moment)} ({human_duration(at - moment)} ago)"


def _lags(lags: Lags) -> str:
    shown = ", ".join(f"{name} {human_duration(value)}" for name, value in lags.percentiles_s.items())
    return f"{shown} ({lags.deletions} deletions)"


def alert_facts(status: Status) -> list[tuple[str, str]]:
    """What the main alerts are about, as plain facts from what status read: no threshold applied."""
    unknown = "unknown: {} not read"
    facts = []
    query = status.query
    facts.append(("PurgerDown", unknown.format("metrics") if query is None
                  else "query running" if query.running else "query not running"))
    batch = status.batch
    facts.append(("PurgerNoBatchCompleted", unknown.format("checkpoint") if batch is None else
                  f"last batch committed {human_duration(status.at - batch.committed_at)} ago"))
    facts.append(("PurgerWatermarkBehind", unknown.format("checkpoint") if batch is None else
                  "no watermark yet" if batch.watermark is None else
                  f"watermark {human_duration(status.at - batch.watermark)} behind the wall clock"))
    lags = status.lags
    facts.append(("PurgerPurgeLagHigh", unknown.format("ledger") if lags is None else
                  "no deletion in the last hour" if not lags.deletions else
                  f"lag p99 {human_duration(lags.percentiles_s['p99'])} over the last hour"))
    if status.today is None:
        facts += [(name, unknown.format("ledger")) for name in
                  ("PurgerErrorsRising", "PurgerAlreadyGoneRising", "PurgerRecordsDeadLettered")]
    else:
        counts = {each: sum(c[each] for c in status.today.values()) for each in STATUSES}
        # As the rules count shares: of the decisions about candidates, dead letters apart.
        decisions = sum(counts.values()) - counts[DEAD_LETTERED]

        def share(n: int) -> str:
            return f"{n} of {decisions} decisions today" + (f" ({n / decisions:.1%})" if decisions else "")

        facts += [("PurgerErrorsRising", f"errors: {share(counts[ERROR])}"),
                  ("PurgerAlreadyGoneRising", f"already gone: {share(counts[ALREADY_GONE])}"),
                  ("PurgerRecordsDeadLettered", f"dead letters today: {counts[DEAD_LETTERED]}")]
    reconciled = status.reconcile
    if reconciled is None:
        facts += [(name, unknown.format("reconcile report")) for name in
                  ("PurgerReconcileFoundOverdue", "PurgerReconcileOrphansMany")]
    else:
        total = {each: sum(c[each] for c in reconciled.by_policy.values()) for each in RECONCILE_COUNTS}
        facts += [("PurgerReconcileFoundOverdue", f"overdue rows in the last reconcile: {total['overdue_fed']}"),
                  ("PurgerReconcileOrphansMany", f"orphans found by the last reconcile: {total['orphans_found']}")]
    interval = human_duration(status.reconcile_interval_s)
    facts.append(("PurgerReconcileMissing",
                  "no schedule (reconcile.interval = 0)" if not status.reconcile_interval_s else
                  f"none recorded; reconcile.interval {interval}" if reconciled is None else
                  f"last finished {human_duration(status.at - reconciled.finished)} ago; "
                  f"reconcile.interval {interval}"))
    return facts


def _overview(status: Status) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.title = f"Purger status at {_clock(status.at)}"
    grid.title_justify = "left"
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column(overflow="fold")
    query = status.query
    if query is None:
        grid.add_row("query", "unknown (metrics not read)")
    else:
        started = _moment(query.since, status.at) if query.since else None
        grid.add_row("query", ("running" if query.running else "not running")
                     + (f", {'since' if query.running else 'last started'} {started}" if started else ""))
    batch = status.batch
    if batch is None:
        grid.add_row("last batch", "unknown (checkpoint not read)")
    else:
        took = f", took {human_duration(batch.duration_s)}" if batch.duration_s is not None else ""
        grid.add_row("last batch", f"{batch.id}, committed {_moment(batch.committed_at, status.at)}{took}")
        if batch.planned is not None:
            grid.add_row("planned", f"batch {batch.planned} at {_moment(batch.planned_at, status.at)}, not committed")
        grid.add_row("watermark", "none yet" if batch.watermark is None else
                     f"{_clock(batch.watermark)}, "
                     f"{human_duration(status.at - batch.watermark)} behind the wall clock")
    grid.add_row("lag, last hour", "unknown (ledger not read)" if status.lags is None else
                 "no deletion" if not status.lags.deletions else _lags(status.lags))
    return grid


def _today(status: Status) -> RenderableType:
    day = status.at.date()
    if not status.today:
        return Text(f"Today, {day} (UTC): " + ("ledger not read" if status.today is None else "no ledger records"))
    rows = status.today
    columns = [(PURGED, "purged"), (WOULD_DELETE, "would\ndelete"), (ALREADY_GONE, "already\ngone"),
               (SKIPPED, "skipped"), (ERROR, "errors"), (DEAD_LETTERED, "dead\nletters")]
    # A dry run's and a replay's statuses only when there are some, as in the daily report.
    shown = [(s, h) for s, h in columns
             if s in (PURGED, SKIPPED, ERROR, DEAD_LETTERED) or any(c[s] for c in rows.values())]
    table = narrow_table()
    table.add_column("policy", overflow="fold")
    for each, header in shown:
        figures_column(table, header, [str(c[each]) for c in rows.values()])
    for policy, counts in rows.items():
        table.add_row(policy, *(str(counts[each]) for each, _ in shown))
    return Group(Text(f"Today, {day} (UTC), from {status.ledger}"), table)


def _reconcile(status: Status) -> RenderableType:
    reconciled = status.reconcile
    if reconciled is None:
        return Text("Last reconcile: not read")
    took = human_duration(reconciled.finished - reconciled.started)
    table = narrow_table()
    table.add_column("policy", overflow="fold")
    headers = ("scanned", "unknown\nfed", "overdue\nfed", "orphans")
    for each, header in zip(RECONCILE_COUNTS, headers):
        figures_column(table, header, [str(c[each]) for c in reconciled.by_policy.values()])
    for policy, counts in reconciled.by_policy.items():
        table.add_row(policy, *(str(counts[each]) for each in RECONCILE_COUNTS))
    return Group(Text(f"Last reconcile{' (dry run)' if reconciled.dry_run else ''}: finished "
                      f"{_moment(reconciled.finished, status.at)}, took {took}"), table)


def _titled(title: str, headers: tuple[str, str, str, str], rows: list[tuple[str, str, str, str]]) -> RenderableType:
    """A title over a table of a name, a figure, a moment and a text (the holds, the stuck objects)."""
    table = narrow_table()
    table.add_column(headers[0], overflow="fold")
    figures_column(table, headers[1], [row[1] for row in rows])
    table.add_column(headers[2], no_wrap=True)
    table.add_column(headers[3], overflow="fold")
    for row in rows:
        table.add_row(*row)
    return Group(Text(title), table)


def _holds(status: Status) -> RenderableType:
    if status.holds is None:
        return Text("Legal holds: not read")
    if not status.holds:
        return Text("Legal holds: none in force")
    in_force = [hold for hold in status.holds if not hold.release_cut_short]
    cut_short = len(status.holds) - len(in_force)
    held = sum(hold.held_objects for hold in in_force)
    return _titled(f"Legal holds: {len(in_force)} in force, keeping {held} objects"
                   + (f"; {cut_short} releases cut short" if cut_short else ""),
                   ("scope", "held", "since", "by and why"),
                   [(hold.scope, str(hold.held_objects), "-", f"released, but not looked at again: run `purger release "
                                                              f"{hold.scope}` again")
                    if hold.release_cut_short else
                    (hold.scope, str(hold.held_objects), _moment(hold.placed_at, status.at) if hold.placed_at else "-",
                     f"{hold.placed_by}: {hold.reason}") for hold in status.holds])


# The stuck objects shown, the longest failing first.
STUCK_SHOWN = 10


def _stuck(status: Status) -> RenderableType:
    if status.stuck is None:
        return Text("Failing for over an hour: not read")
    if not status.stuck:
        return Text("Failing for over an hour: none")
    more = f" (the {STUCK_SHOWN} longest below)" if len(status.stuck) > STUCK_SHOWN else ""
    return _titled(f"Failing for over an hour: {len(status.stuck)} objects, still retried{more}",
                   ("object", "tries", "since", "last error"),
                   [(f"{stuck.kind} {stuck.id}", str(stuck.failures), _moment(from_epoch_ms(stuck.since_ms), status.at),
                     stuck.error) for stuck in status.stuck[:STUCK_SHOWN]])


def _alerts(status: Status) -> RenderableType:
    if status.alerts is None:
        why = "Prometheus did not answer" if status.prometheus else "they need Prometheus (--prometheus URL)"
        table = narrow_table()
        table.add_column("alert", no_wrap=True)
        table.add_column("fact", overflow="fold")
        for name, fact in alert_facts(status):
            table.add_row(name, fact)
        return Group(Text(f"Alerts: {why}; what the main ones are about:"), table)
    if not status.alerts:
        return Text(f"Alerts from {status.prometheus}: none firing or pending")
    table = narrow_table()
    table.add_column("alert", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("since", no_wrap=True)
    table.add_column("summary", overflow="fold")
    for alert in status.alerts:
        since = human_duration(status.at - alert.since) if alert.since else "-"
        table.add_row(alert.name, f"{alert.state} ({alert.severity})" if alert.severity else alert.state,
                      since, alert.summary)
    return Group(Text(f"Alerts from {status.prometheus}"), table)


def render(status: Status) -> RenderableType:
    """The screen: the query and the checkpoint, today's outcomes, the last reconcile, the legal holds, the objects
    failing for long, the alerts (or their facts), and what could not be read. Reads at 80 columns."""
    parts: list[RenderableType] = [_overview(status), _today(status), _reconcile(status), _holds(status),
                                   _stuck(status), _alerts(status)]
    if status.unread:
        parts.append(Text("Could not read:\n" + "\n".join(f"- {line}" for line in status.unread)))
    spaced: list[RenderableType] = []
    for part in parts:
        spaced += [Text(""), part] if spaced else [part]
    return Group(*spaced)


def as_json(status: Status) -> str:
    """The status for a script: every figure read, times in ISO 8601 (UTC), ``null`` for what was not read,
    and ``unread``'s lines."""
    return json.dumps(asdict(status), default=json_value, indent=2)
