"""The `purger` command: its parsing; what it prints is ``purger.output``'s.

    purger run [--config F] [--dry-run]          the streaming purge job, until interrupted
               [--log-level INFO]                a line per batch; WARNING: warnings only
    purger replay [--from earliest|TIME]         the same, from a fresh checkpoint, with a progress bar
                  --reason WHY [--actor WHO]     ... recorded in the ledger (as a reconcile's)
    purger report [--date D] [--dry-run]         the daily purge report, from the ledger (or the dry run's)
    purger pending [--hours N]                   what the checkpoint's state will purge in the next N hours
    purger reconcile [--policy P] [--dry-run]    scan the store: feed back what the stream does not know
                     --reason WHY [--actor WHO]  ... who ran it and why, in the ledger (no reason: a dry run)
    purger status [--json] [--prometheus URL]    is it healthy: the query, the last batch, today's outcomes, alerts
                  [--dry-run]                    ... of the dry run
    purger setup [--config F]                    create the purger's own topics; check topics, tables, buckets
                 [--rate 100M]                   ... first the cores and settings for that many messages a day
    purger submit-line --master URL [--config F] the spark-submit line of the purge job on a cluster
    purger schema [--config F]                   the enabled policies' reference CQL, under the configured names
                  [--replication dc1:3,dc2:3]    ... and the keyspace's CREATE KEYSPACE
    purger --version                             the version
"""

from __future__ import annotations

import getpass
import os
import signal
import threading
import uuid
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer

from purger.core.settings import ConfigError, PurgerConfig

from purger import __version__
from purger.config import load_config
from purger.logs import LogLevel, log_to_stderr, set_spark_log_level, spark_level

if TYPE_CHECKING:  # the Spark modules load when a command needs them
    from pyspark.sql import SparkSession

    from purger.running import RunningPurger
    from purger.setup import Findings

app = typer.Typer(help="A continuous purger on Spark Structured Streaming.", no_args_is_help=True)

ConfigOption = typer.Option(None, "--config", "-c", help="TOML configuration file (defaults apply without one).")
JsonOption = typer.Option(False, "--json", help="Print it as JSON, for scripts.")
LogLevelOption = typer.Option(LogLevel.INFO, "--log-level", case_sensitive=False,
                              help="The purger's own log level (a line per batch at INFO); Spark logs at WARN, "
                                   "or at this level when it is higher.")


def _print_version(requested: bool) -> None:
    if requested:
        typer.echo(f"purger {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """The options before any command (the app's help is Typer's, above): --version, eager so that it
    answers without a command."""


def load_or_exit(path: Optional[Path]) -> PurgerConfig:
    try:
        return load_config(path)
    except ConfigError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


@app.command("setup")
def setup(
    config_file: Optional[Path] = ConfigOption,
    rate: Optional[str] = typer.Option(None, "--rate", help="New messages a day (e.g. 100M, 1B): print the cores "
                                                            "and settings that volume needs, and create the "
                                                            "purger's topics with its partitions."),
    events_per_message: float = typer.Option(2.2, "--events-per-message", help="With --rate."),
    payloads_per_message: float = typer.Option(0.7, "--payloads-per-message", help="With --rate: stored "
                                                                                 "payloads a message."),
    retention_days: float = typer.Option(6, "--retention-days", help="With --rate: days an object stays "
                                                                      "in the state before its purge."),
    as_json: bool = JsonOption,
) -> None:
    """Create the purger's own topics if missing; check the events topics, tables, columns and buckets; say
    which consistency levels the keyspace's replication asks of the platform's writes. With --rate, first the
    cores and settings for that volume (docs/sizing.md)."""
    from purger.core.sizing import Volume, parse_rate, size
    from purger.output import output
    from purger.setup import set_up

    config = load_or_exit(config_file)
    sizing = None
    if rate is not None:
        try:
            sizing = size(Volume(parse_rate(rate), events_per_message, payloads_per_message, retention_days,
                                 config.reconcile.max_rows_per_second))
        except ValueError as error:
            typer.echo(f"--rate: {error}", err=True)
            raise typer.Exit(2) from None
    findings = set_up(config, sizing=sizing)
    output(as_json).setup(sizing, findings)
    if findings.problems:
        raise typer.Exit(2)


@app.command("schema")
def schema(config_file: Optional[Path] = ConfigOption,
           replication: Optional[str] = typer.Option(
               None, "--replication", help="DC:REPLICAS,...: the keyspace's data centres and their replicas, for "
                                           "its CREATE KEYSPACE (e.g. dc1:3,dc2:3).")) -> None:
    """Print the enabled policies' reference tables as CQL, under the configured keyspace and table names; with
    --replication, the keyspace's CREATE KEYSPACE first."""
    from purger.setup import reference_schema

    replicas = {}
    for part in filter(None, (replication or "").split(",")):
        dc, _, count = part.partition(":")
        if not dc.strip() or not count.strip().isdigit() or int(count) < 1:
            typer.echo(f"--replication takes DC:REPLICAS,... (e.g. dc1:3,dc2:3); {part!r} is not one", err=True)
            raise typer.Exit(2)
        replicas[dc.strip()] = int(count)
    typer.echo(reference_schema(load_or_exit(config_file), replicas))


def _exit_on_problems(findings: Findings) -> None:
    """Print each problem on a line of its own and exit 2 when there is any."""
    for problem in findings.problems:
        typer.echo(problem, err=True)
    if findings.problems:
        raise typer.Exit(2)


def check_platform(config: PurgerConfig) -> None:
    """Exit 2 with a line per problem when a topic, table, column or bucket is missing or a server does not
    answer: before Spark starts, rather than a query failing with a Java stack trace."""
    from purger.setup import check

    _exit_on_problems(check(config))


def refuse_speculation(spark: SparkSession) -> None:
    """Exit 2 with a line saying why when the session's application runs speculative tasks, which would run
    deletes twice at once (``purger.spark.speculation_refusal``)."""
    from purger.spark import speculation_refusal

    refusal = speculation_refusal(spark.sparkContext.getConf())
    if refusal is not None:
        typer.echo(refusal, err=True)
        spark.stop()
        raise typer.Exit(2)


def _run(config: PurgerConfig, log_level: LogLevel, start: Callable[..., RunningPurger]) -> None:
    """Check the platform, start the purger with ``start(spark, config, stop_requested)`` and run it until
    Ctrl-C or SIGTERM (which set ``stop_requested``); the query then stops between micro-batches."""
    from purger.spark import spark_session
    from purger.streams.checkpoint import CheckpointRefused

    log_to_stderr(log_level)
    check_platform(config)
    spark = spark_session(config.stream, log_level=spark_level(log_level))
    refuse_speculation(spark)
    set_spark_log_level(spark, log_level)
    stop_requested = _set_on_signals(signal.SIGINT, signal.SIGTERM)  # after the session: PySpark sets its own
    jvm_handler = _set_on_jvm_signal(spark, stop_requested)  # noqa: F841 - referenced while the JVM may call it
    try:
        running = start(spark, config, stop_requested)
    except CheckpointRefused as refused:
        typer.echo(str(refused), err=True)
        spark.stop()
        raise typer.Exit(2) from None
    typer.echo(f"purger running: query {config.stream.query_name!r}, checkpoint "
               f"{config.stream.checkpoint_location}, ledger {config.ledger.path}, "
               f"Spark UI {spark.sparkContext.uiWebUrl}"
               + (f", metrics {config.metrics.url}" if config.metrics.url else "")
               + (" (dry run: nothing is deleted)" if config.stream.dry_run else ""))
    try:
        # The signal handler only sets the event; short waits let this loop see it.
        while not stop_requested.is_set() and not running.query.awaitTermination(1):
            pass
    finally:
        if stop_requested.is_set():
            typer.echo("stopping")
        running.stop()
        typer.echo(how_it_stopped(running))
        # The session before the process: its JVM's threads (Python workers, the listener bus) end while
        # Python still answers their calls.
        spark.stop()


def how_it_stopped(running: RunningPurger) -> str:
    """The run's last line: stopped cleanly after which batch, or why not cleanly."""
    last = running.sink.last_batch
    after = "before its first batch" if last is None else f"after batch {last}"
    failure = running.failure
    if failure is not None:
        reason = (str(failure).strip().splitlines() or [type(failure).__name__])[0]
        return f"stopped {after}: the query failed: {reason}"
    if running.stopped_cleanly is False:
        return (f"stopped {after}, cutting the next batch in its deletions or its ledger write: it runs again "
                "at the next start, which records its deletions")
    return f"stopped cleanly {after}"


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


class _JvmSignalHandler:
    """A ``sun.misc.SignalHandler`` of the driver's JVM, in Python through Py4J: the first signal sets
    ``requested``, a second goes to the JVM's own handler (its shutdown)."""

    def __init__(self, requested: threading.Event) -> None:
        self.requested = requested
        self.previous: Any = None

    def handle(self, sig: Any) -> None:
        if self.requested.is_set() and self.previous is not None:
            self.previous.handle(sig)
        self.requested.set()

    class Java:
        implements = ["sun.misc.SignalHandler"]


def _set_on_jvm_signal(spark: Any, requested: threading.Event, name: str = "TERM") -> _JvmSignalHandler:
    """Under spark-submit the JVM started this driver, and a SIGTERM to spark-submit reaches the JVM, whose own
    handler ends it in the middle of a batch (exit 143, a traceback in the batch's write). Its handler then sets
    ``requested`` as this process's does (``_set_on_signals``), so the query stops between micro-batches and this
    process, then spark-submit, exit 0. Keep the returned handler referenced while it may be called."""
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(spark.sparkContext._gateway)
    signals = spark.sparkContext._jvm.sun.misc.Signal
    handler = _JvmSignalHandler(requested)
    handler.previous = signals.handle(signals(name), handler)
    return handler


DryRunOption = typer.Option(False, "--dry-run", help="Decide and record would_delete in the dry run's own ledger "
                                                       "(<ledger.path>.dry-run); delete nothing.")


ActorOption = typer.Option(None, "--actor", help="Who runs it, as the ledger records it (default: the OS user); "
                                                   "set it from the identity your SSO gives you.")
ReasonOption = typer.Option(None, "--reason", help="Why it runs (a ticket, an incident), recorded in the ledger with "
                                                   "who ran it. Required unless --dry-run.")


def _who_and_why(command: str, actor: Optional[str], reason: Optional[str], dry_run: bool) -> tuple[str, str]:
    """Who runs a command that changes what is deleted, and why, for its ledger record (``Ledger.record_command``);
    a command without a reason is refused in one line, before anything starts."""
    if not dry_run and not (reason or "").strip():
        typer.echo(f"purger {command} changes what is deleted: say why with --reason (a ticket, an incident); the "
                   "ledger records it with who ran it (--actor, by default the OS user)", err=True)
        raise typer.Exit(2)
    if not actor:
        try:
            actor = getpass.getuser()
        except (KeyError, OSError):  # a container's user with no name
            actor = f"uid {os.getuid()}"
    return actor, reason or ""


def _with_dry_run(config: PurgerConfig, dry_run: bool) -> PurgerConfig:
    """The configuration of a dry run on ``config`` (``PurgerConfig.as_dry_run``: its own checkpoint, topics and
    ledger) when ``dry_run``; one that has no place for them is one line naming the key."""
    try:
        return config.as_dry_run() if dry_run else config
    except ConfigError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


@app.command("run")
def run(
    config_file: Optional[Path] = ConfigOption,
    dry_run: bool = DryRunOption,
    starting_offsets: Optional[str] = typer.Option(
        None, help="For a fresh checkpoint: earliest, latest, or Spark's JSON offsets (default: from the config)."
    ),
    log_level: LogLevel = LogLevelOption,
) -> None:
    """Run the purge job until interrupted (Ctrl-C stops it cleanly)."""
    from purger.running import start_purger

    _run(_with_dry_run(load_or_exit(config_file), dry_run), log_level,
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
    config_file: Optional[Path] = ConfigOption,
    since: str = typer.Option("earliest", "--from", help="earliest, or an ISO time: replay the events from then."),
    dry_run: bool = DryRunOption,
    actor: Optional[str] = ActorOption,
    reason: Optional[str] = ReasonOption,
    log_level: LogLevel = LogLevelOption,
) -> None:
    """Replay the events topics into a fresh checkpoint (the old one is renamed), catch up, keep running."""
    from purger.replay import follow, start_replay
    from purger.sinks.ledger import Ledger

    who, why = _who_and_why("replay", actor, reason, dry_run)
    since_ms = _moment(since)
    config = _with_dry_run(load_or_exit(config_file), dry_run)

    def start(spark, s, stop_requested):
        if not dry_run:
            Ledger(spark, s.ledger).record_command("replay", [p.name for p in s.policy_set.policies], who, why,
                                                   uuid.uuid4().hex[:12])
        running, to_read = start_replay(spark, s, since_ms)
        typer.echo(f"replaying {to_read.total} events from {since}")
        if follow(running.query, to_read, stop=stop_requested):
            typer.echo("caught up; running on")
        return running

    _run(config, log_level, start)


@app.command("report")
def report(
    config_file: Optional[Path] = ConfigOption,
    day: Optional[str] = typer.Option(None, "--date", help="The day, YYYY-MM-DD (UTC); default today."),
    dry_run: bool = typer.Option(False, "--dry-run", help="The dry run's report, from its own ledger "
                                                          "(<ledger.path>.dry-run)."),
    as_json: bool = JsonOption,
) -> None:
    """Bring the purge report up to date from the ledger (what was written since its last refresh) and print a day."""
    from purger.output import output
    from purger.sinks.ledger import Report
    from purger.spark import spark_session

    try:
        when = date.fromisoformat(day) if day else datetime.now(timezone.utc).date()
    except ValueError:
        raise typer.BadParameter(f"--date {day!r}: write a day as YYYY-MM-DD") from None
    config = _with_dry_run(load_or_exit(config_file), dry_run)
    # Only Spark's errors: its start's warnings are about the host, not the report.
    spark = spark_session(config.stream, app_name="purger-report", log_level="ERROR", one_off=True)
    purge_report = Report(spark, config.ledger, config.policy_set)
    purge_report.refresh()
    output(as_json).report(when, config.ledger.path, purge_report.rows(when))


@app.command("pending")
def pending(
    config_file: Optional[Path] = ConfigOption,
    hours: float = typer.Option(24, min=0, help="How far ahead to look."),
    limit: int = typer.Option(1000, min=1, help="At most this many rows."),
    as_json: bool = JsonOption,
) -> None:
    """List the objects the checkpoint's state will purge in the next N hours (read from its state store)."""
    from purger.output import output
    from purger.spark import spark_session
    from purger.streams.pending import pending_purges

    config = load_or_exit(config_file)
    until = datetime.now(timezone.utc) + timedelta(hours=hours)
    spark = spark_session(config.stream, app_name="purger-pending", log_level="ERROR", one_off=True)
    rows = pending_purges(spark, config.stream.checkpoint_location, until,
                          config.policy_set).limit(limit).collect()
    output(as_json).pending(rows, hours * 3600, config.stream.checkpoint_location, config.stream.watermark_delay)




@app.command("status")
def status(
    config_file: Optional[Path] = ConfigOption,
    as_json: bool = JsonOption,
    metrics: Optional[str] = typer.Option(None, "--metrics", help="The running purger's metrics endpoint "
                                          "(default: http://<metrics.host>:<metrics.port>/metrics)."),
    prometheus: Optional[str] = typer.Option(None, "--prometheus", envvar="PURGER_PROMETHEUS_URL",
                                             help="A Prometheus that scrapes the purger: its alerts are shown."),
    dry_run: bool = typer.Option(False, "--dry-run", help="The dry run's: its checkpoint, ledger and reconciles."),
) -> None:
    """Is it healthy: the query, the last batch, the watermark, today's outcomes, the last hour's purge lag,
    the last reconcile, the alerts; and a line for each thing it could not read."""
    from purger.output import output
    from purger.spark import spark_session
    from purger.status import gather

    config = _with_dry_run(load_or_exit(config_file), dry_run)
    spark = spark_session(config.stream, app_name="purger-status", log_level="ERROR", one_off=True)
    output(as_json).status(gather(spark, config, metrics, prometheus))


@app.command("submit-line")
def submit_line(
    master: str = typer.Option(..., "--master", help="The cluster's master URL, as spark-submit takes it "
                                                     "(spark://host:7077, yarn, k8s://...)."),
    config_file: Optional[Path] = ConfigOption,
    dry_run: bool = DryRunOption,
    workdir: Path = typer.Option(Path("purger-submit"), "--workdir",
                                 help="Where the zip of the purger's packages for --py-files is written."),
    executor_memory: str = typer.Option("1g", "--executor-memory", help="Each executor's memory."),
    total_cores: Optional[int] = typer.Option(None, "--total-cores", help="spark.cores.max: the cores the job "
                                                                          "takes on a standalone cluster."),
    driver_host: Optional[str] = typer.Option(None, "--driver-host", help="The address the executors reach the "
                                                                          "driver at (default: Spark's choice)."),
    conf: list[str] = typer.Option([], "--conf", help="KEY=VALUE: another spark-submit setting (repeatable)."),
    as_json: bool = JsonOption,
) -> None:
    """Print the spark-submit line of the purge job on a cluster; fetches the jars and writes the zip it names
    (docs/operations.md, "On a cluster")."""
    from purger.output import output
    from purger.submit import submit_command

    config = load_or_exit(config_file)
    settings = dict(item.split("=", 1) for item in conf if "=" in item)
    if len(settings) != len(conf):
        typer.echo(f"--conf takes KEY=VALUE: {', '.join(c for c in conf if '=' not in c)}", err=True)
        raise typer.Exit(2)
    command = submit_command(master, config, config_file, workdir=workdir,
                             job_args=["--dry-run"] if dry_run else [], executor_memory=executor_memory,
                             total_cores=total_cores, driver_host=driver_host, conf=settings)
    output(as_json).submit_line(command)


@app.command("reconcile")
def reconcile(
    config_file: Optional[Path] = ConfigOption,
    policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="Only this policy (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Feed nothing back and delete no orphan blob; count "
                                                          "them, and record would_delete for the orphans in the "
                                                          "dry run's ledger."),
    actor: Optional[str] = ActorOption,
    reason: Optional[str] = ReasonOption,
    log_level: LogLevel = LogLevelOption,
    as_json: bool = JsonOption,
) -> None:
    """Scan the enabled policies' tables and object stores; feed back to the stream what it does not know or
    left overdue, delete orphan blobs; print the run's report."""
    from purger.output import output
    from purger.reconcile.run import reconcile as run_reconcile
    from purger.reconcile.verdict import ReconcileError
    from purger.sinks.ledger import Ledger
    from purger.spark import spark_session

    # The stream's own checkpoint is compared with, even in a dry run: not the dry-run one ``--dry-run`` on
    # `purger run` would use. A dry run's records (the orphans' would_delete, the report's rows) go to the dry
    # run's ledger all the same (``purger.reconcile.run.reconcile``).
    who, why = _who_and_why("reconcile", actor, reason, dry_run)
    config = load_or_exit(config_file)
    dry_run = dry_run or config.stream.dry_run
    log_to_stderr(log_level)
    check_platform(config)
    spark = spark_session(config.stream, app_name="purger-reconcile", log_level=spark_level(log_level),
                          one_off=True)
    refuse_speculation(spark)  # its orphans' deletes run in Spark tasks
    set_spark_log_level(spark, log_level)
    try:
        # This process ends after the reconcile, and what Spark keeps of a state read goes with it.
        run = uuid.uuid4().hex[:12]
        if not dry_run:
            chosen = [p.name for p in config.policy_set.policies if not policy or p.name in policy]
            Ledger(spark, config.ledger).record_command("reconcile", chosen, who, why, run)
        rows = run_reconcile(spark, config, policy or None, dry_run, state_apart=False, run_id=run)
    except (ReconcileError, ConfigError) as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    finally:
        spark.stop()
    output(as_json).reconcile(rows, dry_run)


ScopeArgument = typer.Argument(..., help="What to hold: KIND:ID, a scope a policy names (message:m1, mailbox:alice, "
                                         "user:u1, unit_of_work:uw1).")


def _scope(text: str) -> Any:
    from purger.core.holds import Scope

    try:
        return Scope.parse(text)
    except ValueError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


def _policies_naming(config: PurgerConfig, scope: Any) -> list[str]:
    from purger.holds import HoldRefused, policies_naming

    try:
        return policies_naming(config, scope)
    except HoldRefused as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


def _hold_command(command: str, scope: str, config_file: Optional[Path], actor: Optional[str], reason: Optional[str],
                  act: Callable[..., Any]) -> tuple[Any, Any]:
    """``hold`` or ``release``: the scope checked, the command recorded in the ledger with who and why, then
    ``act(spark, config, scope, who, why)``; its refusal is one line and exit code 2."""
    from purger.holds import HoldRefused
    from purger.sinks.ledger import Ledger
    from purger.spark import spark_session

    who, why = _who_and_why(command, actor, reason, False)
    found, config = _scope(scope), load_or_exit(config_file)
    policies = _policies_naming(config, found)
    spark = spark_session(config.stream, app_name=f"purger-{command}", log_level="ERROR", one_off=True)
    try:
        ledger = Ledger(spark, config.ledger)
        ledger.record_command(command, policies, who, f"{ledger.pseudonyms.scope(str(found))}: {why}",
                              uuid.uuid4().hex[:12])
        return found, act(spark, config, found, who, why)
    except HoldRefused as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    finally:
        spark.stop()


@app.command("hold")
def hold(
    scope: str = ScopeArgument,
    config_file: Optional[Path] = ConfigOption,
    actor: Optional[str] = ActorOption,
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (a case, a ticket): kept with the hold and "
                                                                "recorded in the ledger with who placed it."),
    wait: float = typer.Option(600, "--wait", help="Seconds to wait for the batch in flight when the hold is "
                                                   "placed, which may still delete under it."),
) -> None:
    """Place a legal hold: nothing under the scope is deleted until it is released, whatever the rules say. In
    force when this returns."""
    from purger.holds import place_hold

    def placed(spark: Any, config: PurgerConfig, found: Any, who: str, why: str) -> Any:
        return place_hold(spark, config, found, why, who, wait, say=lambda line: typer.echo(line, err=True))

    found, done = _hold_command("hold", scope, config_file, actor, reason, placed)
    if done.already is not None:
        typer.echo(f"{found} already held: {done.already.why()}")
        return
    typer.echo(f"{found} held: in force")
    if done.waited_for is not None:
        what = "it" if done.exact else f"the policies {found.kind} is a scope of (the ledger does not say whose)"
        typer.echo(f"batch {done.waited_for}, in flight when it was placed, purged {len(done.purged)} of {what}"
                   + "".join(f"\n  {kind} {object_id}" + (f" in {dc}" if dc else "")
                             for kind, object_id, dc in done.purged))


@app.command("release")
def release(
    scope: str = ScopeArgument,
    config_file: Optional[Path] = ConfigOption,
    actor: Optional[str] = ActorOption,
    reason: Optional[str] = ReasonOption,
) -> None:
    """Release a legal hold: what became due under it is looked at again now, with no event needed."""
    from purger.holds import release_hold

    found, rechecked = _hold_command("release", scope, config_file, actor, reason,
                                     lambda spark, config, found, who, why: release_hold(config, found))
    if rechecked is None:
        typer.echo(f"no hold on {found}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{found} released: {rechecked} held objects looked at again now")


@app.command("erase")
def erase(
    subject: Optional[str] = typer.Argument(None, help="Whose objects: KIND:ID, a user (user:u1) or a mailbox "
                                                       "(mailbox:alice)."),
    subject_option: Optional[str] = typer.Option(None, "--subject", metavar="KIND:ID",
                                                 help="The same, as an option: `purger erase --subject user:u1`."),
    config_file: Optional[Path] = ConfigOption,
    actor: Optional[str] = ActorOption,
    reason: Optional[str] = ReasonOption,
    request: Optional[str] = typer.Option(None, "--request", help="Finish an earlier run of the same erasure (its "
                                                                  "request id, which it printed first)."),
    wait: float = typer.Option(600, "--wait", help="Seconds to wait for the running purger to decide every object."),
    as_json: bool = JsonOption,
) -> None:
    """Erase a data subject's objects now in every enabled policy, whatever their retention (a hold still wins),
    through the running purger; print the certificate: what was deleted, where, when, its ledger records, and
    what was kept and why."""
    from purger.erase import EraseRefused, find_objects, new_request, remove_images, request_day, send_erasure, \
        subject_rows, wait_for_certificate
    from purger.output import output
    from purger.sinks.ledger import Ledger
    from purger.spark import spark_session

    who, why = _who_and_why("erase", actor, reason, False)
    if (subject is None) == (subject_option is None):
        typer.echo("give the subject once: `purger erase KIND:ID` or `purger erase --subject KIND:ID`", err=True)
        raise typer.Exit(2)
    found, config = _scope(subject or subject_option), load_or_exit(config_file)
    try:
        policies = sorted({policy.name for policy, _ in subject_rows(config, found)})
        request = request or new_request()
        request_day(request)
    except EraseRefused as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    typer.echo(f"request {request}: finish it with `purger erase {found} --request {request}` if this run stops",
               err=True)
    spark = spark_session(config.stream, app_name="purger-erase", log_level="ERROR", one_off=True)
    try:
        ledger = Ledger(spark, config.ledger)
        ledger.record_command("erase", policies, who, f"{ledger.pseudonyms.scope(str(found))}: {why}", request)
        asked = find_objects(spark, config, found)
        typer.echo(f"{len(asked)} objects of {found} found: asking the running purger to erase them", err=True)
        send_erasure(config, asked, request)
        done = wait_for_certificate(spark, config, found, request, asked, wait,
                                    say=lambda line: typer.echo(line, err=True))
        done = remove_images(config, found, asked, done)
    except (EraseRefused, LookupError) as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    finally:
        spark.stop()
    output(as_json).certificate(done)
    if not done.complete:
        typer.echo(f"{len(done.pending)} objects not decided within {wait:.0f} s (is `purger run` running?): run "
                   f"`purger erase {found} --request {request}` again", err=True)
        raise typer.Exit(3)


@app.command("restore")
def restore(
    policy: str = typer.Option(..., "--policy", help="The policy whose deletions to put back (its [policies.NAME])."),
    since: datetime = typer.Option(..., "--since", formats=["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"],
                                   metavar="TIME", help="The deletions from this time on (UTC, YYYY-MM-DDTHH:MM:SS)."),
    until: Optional[datetime] = typer.Option(None, "--until", formats=["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S",
                                                                        "%Y-%m-%d"],
                                             metavar="TIME", help="Up to this time (UTC; default: now)."),
    rule: Optional[str] = typer.Option(None, "--rule", help="Only the deletions of this rule (as the ledger names it)."),
    ids: list[str] = typer.Option([], "--id", help="Only this object and what went with it (repeat for more)."),
    run: Optional[str] = typer.Option(None, "--run", help="Finish an earlier run (its id, which it printed first)."),
    config_file: Optional[Path] = ConfigOption,
    actor: Optional[str] = ActorOption,
    reason: Optional[str] = ReasonOption,
    as_json: bool = JsonOption,
) -> None:
    """Put back what a policy deleted within the undo window (undo.window): rows and blobs, each recorded as
    restored; what it puts back is held until someone releases it, so the policy does not delete it again."""
    from purger.core.times import now_ms
    from purger.output import output
    from purger.restore import RestoreRefused, enabled_policy, new_run, plan_restore, restore as restore_deletions
    from purger.sinks.ledger import Ledger
    from purger.spark import spark_session

    who, why = _who_and_why("restore", actor, reason, False)
    config = load_or_exit(config_file)
    try:
        enabled_policy(config, policy)
    except RestoreRefused as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    since_ms = int(since.replace(tzinfo=timezone.utc).timestamp() * 1000)
    until_ms = int(until.replace(tzinfo=timezone.utc).timestamp() * 1000) if until else now_ms()
    run = run or new_run()
    typer.echo(f"run {run}: finish it with `purger restore ... --run {run}` if this run stops", err=True)
    spark = spark_session(config.stream, app_name="purger-restore", log_level="ERROR", one_off=True)
    try:
        ledger = Ledger(spark, config.ledger)
        ledger.record_command("restore", [policy], who, why, run)
        plan = plan_restore(spark, config, policy, since_ms, until_ms, rule, ids)
        typer.echo(f"{len(plan)} deletions of policies.{policy} in that time; putting them back", err=True)
        done = restore_deletions(spark, config, policy, plan, run, who, why,
                                 say=lambda line: typer.echo(line, err=True))
    except RestoreRefused as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    finally:
        spark.stop()
    output(as_json).restored(done)


@app.command("holds")
def holds(
    config_file: Optional[Path] = ConfigOption,
    as_json: bool = JsonOption,
) -> None:
    """The legal holds in force: scope, reason, who placed them and when, and how many objects each keeps."""
    from purger.holds import HoldRefused, holds_in_force, releases_cut_short
    from purger.core.times import format_epoch_ms
    from purger.output import output

    config = load_or_exit(config_file)
    try:
        found, cut_short = holds_in_force(config), releases_cut_short(config)
    except HoldRefused as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None
    rows = [{"scope": hold.scope, "reason": hold.reason, "placed_by": hold.placed_by,
             "placed_at": format_epoch_ms(hold.placed_at_ms) if hold.placed_at_ms is not None else None,
             "held_objects": count, "release_cut_short": False} for hold, count in found]
    rows += [{"scope": scope, "reason": None, "placed_by": None, "placed_at": None, "held_objects": count,
              "release_cut_short": True} for scope, count in cut_short]
    output(as_json).holds(rows)


ledger_app = typer.Typer(help="The audit ledger's records.", no_args_is_help=True)
app.add_typer(ledger_app, name="ledger")


@ledger_app.command("find")
def ledger_find(
    object_id: str = typer.Argument(..., help="The object's id as the platform names it: a message, a payload, "
                                              "a user, a unit of work."),
    config_file: Optional[Path] = ConfigOption,
    kind: Optional[str] = typer.Option(None, "--kind", help="Only the records of this kind (message, payload, ...)."),
    since: Optional[datetime] = typer.Option(None, "--since", formats=["%Y-%m-%d"], metavar="DAY",
                                             help="Only the records decided on DAY (YYYY-MM-DD, UTC) or later: "
                                                  "only those days are read, not the whole ledger."),
    dry_run: bool = typer.Option(False, "--dry-run", help="In the dry run's ledger (<ledger.path>.dry-run)."),
    as_json: bool = JsonOption,
) -> None:
    """An object's records in the ledger, oldest first; in a pseudonymised ledger too (its id hashed with the key).
    Without --since, every day the ledger keeps is read."""
    from purger.output import output
    from purger.sinks.ledger import Ledger
    from purger.spark import spark_session

    config = _with_dry_run(load_or_exit(config_file), dry_run)
    spark = spark_session(config.stream, app_name="purger-ledger", log_level="ERROR", one_off=True)
    try:
        fields = ("decided_at", "policy", "kind", "dc", "status", "rule", "reason", "deleted_at", "batch_id",
                  "record_id")
        found = Ledger(spark, config.ledger).find(object_id, kind, since.date() if since else None)
        records = [{name: r[name] for name in fields} for r in found]
    finally:
        spark.stop()
    output(as_json).ledger_records(object_id, config.ledger.path, records)
