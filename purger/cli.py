"""The `purger` command.

    purger stack up|down|status                  the local Kafka, Cassandra and S3Proxy
                [--data-centres 2]               and Cassandra's second node, data centre dc2
    purger run [--config F] [--dry-run]          the streaming purge job, until interrupted
               [--log-level INFO]                a line per batch; WARNING: warnings only
    purger replay [--from earliest|TIME]         the same, from a fresh checkpoint, with a progress bar
    purger report [--date D]                     the daily purge report, from the ledger
    purger pending [--hours N]                   what the checkpoint's state will purge in the next N hours
    purger cluster up|down|status                a local Spark standalone cluster (a master, two workers)
    purger submit [--config F] [--dry-run]       the job through spark-submit on that cluster
    purger setup [--config F]                    create the purger's own topics; check topics, tables, buckets
    purger demo                                  a demo workload through the local stack, with a report
"""

from __future__ import annotations

import os
import signal
import threading
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

import typer

from core.config import ConfigError, PurgerConfig, load_config
from purger.logs import LogLevel, log_to_stderr, set_spark_log_level

if TYPE_CHECKING:  # the Spark modules load when a command needs them
    from purger.running import RunningPurger
    from purger.setup import Findings

app = typer.Typer(help="A continuous purger on Spark Structured Streaming.", no_args_is_help=True)
stack_app = typer.Typer(help="The local stack: Kafka, Cassandra and S3Proxy on 127.0.0.1.", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
cluster_app = typer.Typer(help="A Spark standalone cluster on 127.0.0.1: a master and two workers.",
                          no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")

T = TypeVar("T")
ConfigOption = typer.Option(None, "--config", "-c", help="TOML configuration file (defaults apply without one).")
LogLevelOption = typer.Option(LogLevel.INFO, "--log-level", case_sensitive=False,
                              help="The purger's own log level (a line per batch at INFO); Spark logs at WARN, "
                                   "or at this level when it is higher.")


def _config(path: Optional[Path]):
    try:
        return load_config(path)
    except ConfigError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


def _or_exit(action: Callable[[], T]) -> T:
    """Run ``action``; a server that would not start or answer exits 1 with the reason (it names the address)."""
    from devstack.stack import StackError

    try:
        return action()
    except StackError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(1) from None


def _echo_status(statuses: dict[str, str]) -> None:
    for name, state in statuses.items():
        typer.echo(f"{name:14} {state}")


def _stack_up(settings: PurgerConfig, data_centres: int = 1) -> None:
    from devstack.stack import LocalStack

    _or_exit(lambda: LocalStack().up(settings, data_centres))


@stack_app.command("up")
def stack_up(config: Optional[Path] = ConfigOption,
             data_centres: int = typer.Option(1, "--data-centres", min=1, max=2,
                                              help="2: a second Cassandra node, data centre dc2 on 127.0.0.2, "
                                                   "and the keyspace replicated to both.")) -> None:
    """Fetch the jars (cached), start every server, wait until each answers, create topics, schema, buckets."""
    _stack_up(_config(config), data_centres)


@stack_app.command("down")
def stack_down() -> None:
    """Stop the servers that `stack up` started."""
    from devstack.stack import LocalStack

    LocalStack().down()


@stack_app.command("status")
def stack_status() -> None:
    """Say which servers are running."""
    from devstack.stack import LocalStack

    _echo_status(LocalStack().status())


@app.command("setup")
def setup(config: Optional[Path] = ConfigOption) -> None:
    """Create the purger's own topics if missing; check the events topics, tables, columns and buckets."""
    from purger.setup import set_up

    findings = set_up(_config(config))
    for line in findings.created:
        typer.echo(f"created {line}")
    _exit_on_problems(findings)
    if not findings.created:
        typer.echo("nothing to create: the purger's own topics and journal table exist")
    for line in findings.checked:
        typer.echo(f"in place on {line}")


def _exit_on_problems(findings: Findings) -> None:
    """Print each problem on a line of its own and exit 2 when there is any."""
    for problem in findings.problems:
        typer.echo(problem, err=True)
    if findings.problems:
        raise typer.Exit(2)


def _check_platform(settings: PurgerConfig) -> None:
    """Exit 2 with a line per problem when a topic, table, column or bucket is missing or a server does not
    answer: before Spark starts, rather than a query failing with a Java stack trace."""
    from purger.setup import check

    _exit_on_problems(check(settings))


def _run(settings: PurgerConfig, log_level: LogLevel, start: Callable[..., RunningPurger]) -> None:
    """Check the platform, start the purger with ``start(spark, settings, stop_requested)`` and run it until
    Ctrl-C or SIGTERM (which set ``stop_requested``); the query then stops between micro-batches."""
    from purger.spark import spark_session

    log_to_stderr(log_level)
    _check_platform(settings)
    spark = spark_session(settings.stream)
    set_spark_log_level(spark, log_level)
    stop_requested = _set_on_signals(signal.SIGINT, signal.SIGTERM)  # after the session: PySpark sets its own
    running = start(spark, settings, stop_requested)
    typer.echo(f"purger running: query {settings.stream.query_name!r}, checkpoint "
               f"{settings.stream.checkpoint_location}, ledger {settings.ledger.path}, "
               f"Spark UI {spark.sparkContext.uiWebUrl}"
               + (f", metrics http://127.0.0.1:{settings.metrics.port}/metrics" if settings.metrics.port else "")
               + (" (dry run: nothing is deleted)" if settings.stream.dry_run else ""))
    try:
        # The signal handler only sets the event; short waits let this loop see it.
        while not stop_requested.is_set() and not running.query.awaitTermination(1):
            pass
    finally:
        if stop_requested.is_set():
            typer.echo("stopping")
        running.stop()
        # Before the process exits: Spark's listener bus hands its last progress events to the Python
        # listener while Python still answers (else an error with a Java stack trace at every stop).
        spark.stop()


def _set_on_signals(*signals: signal.Signals) -> threading.Event:
    """An event that the first of ``signals`` sets; a second one ends the process at once.

    The handler only sets the event. Raising KeyboardInterrupt instead (Python's default for
    SIGINT, and PySpark's handler) lands inside whatever py4j call the main thread is in; py4j
    then shuts that connection down, and in the kill test the stop that followed found the JVM
    no longer answering, in the middle of a batch whose ledger records were then lost."""
    requested = threading.Event()

    def handler(signum: int, frame) -> None:
        if requested.is_set():
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        requested.set()

    for each in signals:
        signal.signal(each, handler)
    return requested


DryRunOption = typer.Option(False, "--dry-run", help="Decide and record would_delete in the ledger; delete nothing.")


def _with_dry_run(settings: PurgerConfig, dry_run: bool) -> PurgerConfig:
    if not dry_run:
        return settings
    return settings.model_copy(update={"stream": settings.stream.model_copy(update={"dry_run": True})})


@app.command("run")
def run(
    config: Optional[Path] = ConfigOption,
    dry_run: bool = DryRunOption,
    starting_offsets: Optional[str] = typer.Option(
        None, help="For a fresh checkpoint: earliest, latest, or Spark's JSON offsets (default: from the config)."
    ),
    log_level: LogLevel = LogLevelOption,
) -> None:
    """Run the purge job until interrupted (Ctrl-C stops it cleanly)."""
    from purger.running import start_purger

    _run(_with_dry_run(_config(config), dry_run), log_level,
         lambda spark, s, _: start_purger(spark, s, starting_offsets))


def _moment(value: str) -> Optional[int]:
    """``earliest`` -> None; an ISO-8601 time (UTC unless it says) -> epoch milliseconds."""
    if value == "earliest":
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r}: write earliest or an ISO time such as 2026-11-20T08:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


@app.command("replay")
def replay(
    config: Optional[Path] = ConfigOption,
    since: str = typer.Option("earliest", "--from", help="earliest, or an ISO time: replay the events from then."),
    dry_run: bool = DryRunOption,
    log_level: LogLevel = LogLevelOption,
) -> None:
    """Replay the events topics into a fresh checkpoint (the old one is renamed), catch up, keep running."""
    from purger.replay import follow, start_replay

    since_ms = _moment(since)
    settings = _with_dry_run(_config(config), dry_run)

    def start(spark, s, stop_requested):
        running, to_read = start_replay(spark, s, since_ms)
        typer.echo(f"replaying {to_read.total} events from {since}")
        if follow(running.query, to_read, stop=stop_requested):
            typer.echo("caught up; running on")
        return running

    _run(settings, log_level, start)


@app.command("report")
def report(
    config: Optional[Path] = ConfigOption,
    day: Optional[str] = typer.Option(None, "--date", help="The day, YYYY-MM-DD (UTC); default today."),
) -> None:
    """Bring a day's purge report up to date from the ledger and print it."""
    from rich.console import Console

    from policies import policy_set
    from purger.spark import spark_session
    from sinks.ledger import Report

    try:
        when = date.fromisoformat(day) if day else datetime.now(timezone.utc).date()
    except ValueError:
        raise typer.BadParameter(f"--date {day!r}: write a day as YYYY-MM-DD") from None
    settings = _config(config)
    purge_report = Report(spark_session(settings.stream, app_name="purger-report"), settings.ledger,
                          policy_set(settings))
    purge_report.refresh(when)
    rows = purge_report.rows(when)
    title = f"Purge report {when.isoformat()} (UTC), from {settings.ledger.path}"
    Console().print(_report_table(rows, title) if rows else f"no ledger records for {when.isoformat()}")


def _report_table(rows: list, title: str):
    """The daily purge report's rows (``sinks.ledger.Report.rows``) as a table: a column per kind and
    data centre, a line per figure, so it fits a terminal."""
    from rich.table import Table

    from core.vocabulary import STATUSES

    def shown(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.1f}"
        if isinstance(value, datetime):
            return f"{value:%H:%M:%S}"
        if isinstance(value, dict):
            return ", ".join(f"{k} {v}" for k, v in sorted(value.items())) or "-"
        return str(value)

    table = Table(title=title)
    table.add_column("")
    for r in rows:
        table.add_column(f"{r['policy']}: {r['kind']} {r['dc']}", justify="right")
    for figure in ("candidates", *STATUSES, "skipped_by_reason", "lag_p50_s", "lag_p95_s", "lag_p99_s",
                   "started_at", "finished_at", "duration_s"):
        table.add_row(figure.replace("_", " "), *(shown(r[figure]) for r in rows))
    for name in sorted({k for r in rows for k in (r["policy_fields"] or {})}):
        table.add_row(name.replace("_", " "), *(shown((r["policy_fields"] or {}).get(name)) for r in rows))
    return table


@app.command("pending")
def pending(
    config: Optional[Path] = ConfigOption,
    hours: float = typer.Option(24, min=0, help="How far ahead to look."),
    limit: int = typer.Option(1000, min=1, help="At most this many rows."),
) -> None:
    """List the objects the checkpoint's state will purge in the next N hours (read from its state store)."""
    from rich.console import Console
    from rich.table import Table

    from policies import policy_set
    from purger.spark import spark_session
    from streams.pending import pending_purges

    settings = _config(config)
    until = datetime.now(timezone.utc) + timedelta(hours=hours)
    spark = spark_session(settings.stream, app_name="purger-pending")
    rows = pending_purges(spark, settings.stream.checkpoint_location, until,
                          policy_set(settings)).limit(limit).collect()
    table = Table(title=f"Due within {hours:g} h, from {settings.stream.checkpoint_location} "
                        f"(purged about stream.watermark_delay after due)")
    for column in ("due (UTC)", "kind", "id", "rule", "hint"):
        table.add_column(column)
    for r in rows:
        table.add_row(f"{r['due_at']:%Y-%m-%d %H:%M:%S}", r["kind"], r["id"], r["rule"], r["hint"] or "-")
    Console().print(table if rows else f"nothing due within {hours:g} h")


@cluster_app.command("up")
def cluster_up() -> None:
    """Start the master and two workers (spark-class from the pyspark install); wait until both workers join."""
    from devstack.cluster import SparkCluster

    _or_exit(lambda: SparkCluster().up())


@cluster_app.command("down")
def cluster_down() -> None:
    """Stop the processes `cluster up` started."""
    from devstack.cluster import SparkCluster

    SparkCluster().down()


@cluster_app.command("status")
def cluster_status() -> None:
    """Say which of the cluster's processes are running."""
    from devstack.cluster import SparkCluster

    _echo_status(SparkCluster().status())


@app.command("submit")
def submit(config: Optional[Path] = ConfigOption, dry_run: bool = DryRunOption,
           log_level: LogLevel = LogLevelOption) -> None:
    """Run the job with spark-submit on the local cluster (`purger cluster up`) until Ctrl-C."""
    from devstack.cluster import run_submission

    _check_platform(_config(config))  # a mistake in the file or a missing table is reported before anything starts
    job_args = [*(["--dry-run"] if dry_run else []), "--log-level", log_level.value]
    raise typer.Exit(_or_exit(lambda: run_submission(config, job_args=job_args)))


@app.command("demo")
def demo(messages: int = typer.Option(200, min=1, help="How many messages the demo platform writes.")) -> None:
    """Start the local stack if needed, run a demo workload through the purger, print a report."""
    from rich.console import Console
    from rich.table import Table

    from simulation.demo import run_demo
    from simulation.workload import is_purged

    _stack_up(load_config())
    report = run_demo(messages=messages)
    table = Table(title=f"Purge demo: {messages} messages, {report.seconds:.0f} s")
    table.add_column("what")
    table.add_column("expected", justify="right")
    table.add_column("observed", justify="right")
    for name, (expected, observed) in report.scenarios.items():
        outcome = "purged" if is_purged(name) else "kept"
        table.add_row(f"{name}: messages {outcome}", str(expected), str(observed))
    for name, (expected, observed) in report.objects.items():
        table.add_row(name, str(expected), str(observed))
    table.add_row("payloads purged (row and every blob)", str(report.payloads_expected_gone), str(report.payloads_gone))
    table.add_row("payloads kept (still referred to)", str(report.payloads_expected_kept), str(report.payloads_kept))
    for dc, left in sorted(report.blobs_left.items()):
        table.add_row(f"blobs of purged payloads left in {dc}", "0", str(left))
    Console().print(table)
    Console().print(_report_table(report.purge_report, "The demo's purge report, from its ledger"))
    if not report.ok:
        typer.echo("the demo's end state is not the expected one", err=True)
        raise typer.Exit(1)
