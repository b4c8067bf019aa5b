"""The developer tools' command, run from a clone (they are not part of the installed product).

    python -m devstack up [--data-centres 2]      the local Kafka, Cassandra and S3Proxy (and dc2's node)
    python -m devstack down|status
    python -m devstack cluster up|down|status     a local Spark standalone cluster (a master, two workers)
    python -m devstack submit [--config F]        the purge job through spark-submit on that cluster
    python -m devstack demo [--messages N]        a demo workload through the local stack, with a report
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

import typer

from purger.cli import ConfigOption, DryRunOption, LogLevelOption, check_platform, load_or_exit
from purger.core.settings import PurgerConfig
from purger.config import load_config
from purger.logs import LogLevel

if TYPE_CHECKING:
    from rich.table import Table

    from simulation.demo import DemoReport

app = typer.Typer(help="The purger's developer tools: the local stack, a local Spark cluster, the demo.",
                  no_args_is_help=True)
cluster_app = typer.Typer(help="A Spark standalone cluster on 127.0.0.1: a master and two workers.",
                          no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")

T = TypeVar("T")


def _or_exit(action: Callable[[], T]) -> T:
    """Run ``action``; a server that would not start or answer exits 1 with the reason (it names the address):
    also one that stops answering while the stack is prepared (another process stopping it)."""
    from devstack.stack import StackError
    from purger.connectors.errors import ServerUnavailable

    try:
        return action()
    except (StackError, ServerUnavailable) as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(1) from None


def _echo_status(statuses: dict[str, str]) -> None:
    for name, state in statuses.items():
        typer.echo(f"{name:14} {state}")


def _stack_up(config: PurgerConfig, data_centres: int = 1) -> None:
    from devstack.stack import LocalStack

    _or_exit(lambda: LocalStack().up(config, data_centres))


@app.command("up")
def stack_up(config_file: Optional[Path] = ConfigOption,
             data_centres: int = typer.Option(1, "--data-centres", min=1, max=2,
                                              help="2: a second Cassandra node, data centre dc2 on 127.0.0.2, "
                                                   "and the keyspace replicated to both.")) -> None:
    """Fetch the jars (cached), start every server, wait until each answers, create topics, schema, buckets."""
    _stack_up(load_or_exit(config_file), data_centres)


@app.command("down")
def stack_down() -> None:
    """Stop the servers that `up` started."""
    from devstack.stack import LocalStack

    LocalStack().down()


@app.command("status")
def stack_status() -> None:
    """Say which servers are running."""
    from devstack.stack import LocalStack

    _echo_status(LocalStack().status())



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
def submit(config_file: Optional[Path] = ConfigOption, dry_run: bool = DryRunOption,
           log_level: LogLevel = LogLevelOption) -> None:
    """Run the job with spark-submit on the local cluster (`python -m devstack cluster up`) until Ctrl-C."""
    from devstack.cluster import run_submission

    check_platform(load_or_exit(config_file))  # a mistake in the file or a missing table is reported before anything starts
    job_args = [*(["--dry-run"] if dry_run else []), "--log-level", log_level.value]
    raise typer.Exit(_or_exit(lambda: run_submission(config_file, job_args=job_args)))



def demo_table(report: "DemoReport", messages: int) -> "Table":
    """What the demo expected and what it observed, a line per scenario: reads at 80 columns."""
    from rich import box
    from rich.table import Table

    from purger.output import human_duration
    from simulation.workload import is_purged

    existing = f", {report.existing_messages} of them existing" if report.existing_messages else ""
    table = Table(title=f"Purge demo: {messages} messages{existing}, {human_duration(report.seconds)}",
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                  title_justify="left")
    table.add_column("what", overflow="fold")
    table.add_column("expected", justify="right", no_wrap=True)
    table.add_column("observed", justify="right", no_wrap=True)
    for name, (expected, observed) in report.scenarios.items():
        outcome = "purged" if is_purged(name) else "kept"
        table.add_row(f"{name}: messages {outcome}", str(expected), str(observed))
    for name, (expected, observed) in report.objects.items():
        table.add_row(name, str(expected), str(observed))
    for name, (expected, observed) in (report.existing | report.held | report.erased | report.undone).items():
        table.add_row(name, str(expected), str(observed))
    table.add_row("payloads purged (row and every blob)", str(report.payloads_expected_gone), str(report.payloads_gone))
    table.add_row("payloads kept (still referred to)", str(report.payloads_expected_kept), str(report.payloads_kept))
    for dc, left in sorted(report.blobs_left.items()):
        table.add_row(f"blobs of purged payloads left in {dc}", "0", str(left))
    for dc, (written, deleted) in sorted(report.orphans.items()):
        table.add_row(f"orphan blobs (no row) deleted in {dc}", str(written), str(deleted))
    if report.outside_kept[0]:
        table.add_row("blobs outside payloads/ kept", *map(str, report.outside_kept))
    return table


def where_table(report: "DemoReport") -> "Table":
    """Where the demo's data stays for a look (nothing is dropped): reads at 80 columns."""
    from rich.table import Table

    table = Table(title="The demo's data, kept for a look", box=None, show_header=False, pad_edge=False,
                  title_justify="left")
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    for what, place in report.where.items():
        table.add_row(what, place)
    return table


@app.command("demo")
def demo(messages: int = typer.Option(200, min=1, help="How many messages the demo platform writes.")) -> None:
    """Start the local stack if needed, run a demo workload through the purger on a platform that already has
    data (its first reconcile finds it), print a report."""
    from rich.console import Console

    from devstack.stack import prepare
    from purger.output import reconcile_table, report_tables
    from simulation.demo import run_demo

    _stack_up(load_config())
    report = run_demo(prepare, messages=messages)
    console = Console()
    console.print(demo_table(report, messages))
    console.print()
    console.print(report_tables(report.purge_report, "The demo's purge report, from its ledger"))
    console.print()
    console.print(reconcile_table(report.reconcile, "The purger's reconcile at its start, from its ledger")
                  if report.reconcile else "no reconcile was recorded")
    console.print()
    console.print(where_table(report))
    if not report.ok:
        typer.echo("the demo's end state is not the expected one", err=True)
        raise typer.Exit(1)


if __name__ == "__main__":
    app(prog_name="python -m devstack")
