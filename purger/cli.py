"""The `purger` command.

    purger stack up|down|status   the local Kafka, Cassandra and S3Proxy
    purger run [--config F]       the streaming purge job, until interrupted
    purger demo                   a demo workload through the local stack, with a report
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from purger.config import ConfigError, PurgerConfig, load_config

app = typer.Typer(help="A continuous purger on Spark Structured Streaming.", no_args_is_help=True)
stack_app = typer.Typer(help="The local stack: Kafka, Cassandra and S3Proxy on 127.0.0.1.", no_args_is_help=True)
app.add_typer(stack_app, name="stack")

ConfigOption = typer.Option(None, "--config", "-c", help="TOML configuration file (defaults apply without one).")


def _config(path: Optional[Path]):
    try:
        return load_config(path)
    except ConfigError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(2) from None


def _stack_up(settings: PurgerConfig) -> None:
    from purger.stack import LocalStack, StackError

    try:
        LocalStack().up(settings)
    except StackError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(1) from None


@stack_app.command("up")
def stack_up(config: Optional[Path] = ConfigOption) -> None:
    """Fetch the jars (cached), start every server, wait until each answers, create topics, schema, buckets."""
    _stack_up(_config(config))


@stack_app.command("down")
def stack_down() -> None:
    """Stop the servers that `stack up` started."""
    from purger.stack import LocalStack

    LocalStack().down()


@stack_app.command("status")
def stack_status() -> None:
    """Say which servers are running."""
    from purger.stack import LocalStack

    for name, state in LocalStack().status().items():
        typer.echo(f"{name:10} {state}")


@app.command("run")
def run(
    config: Optional[Path] = ConfigOption,
    starting_offsets: Optional[str] = typer.Option(
        None, help="For a fresh checkpoint: earliest, latest, or Spark's JSON offsets (default: from the config)."
    ),
) -> None:
    """Run the purge job until interrupted (Ctrl-C stops it cleanly)."""
    from purger.spark import spark_session
    from streams.query import start_purger

    settings = _config(config)
    spark = spark_session(settings.stream)
    running = start_purger(spark, settings, starting_offsets)
    typer.echo(f"purger running: query {settings.stream.query_name!r}, checkpoint {settings.stream.checkpoint}, "
               f"Spark UI {spark.sparkContext.uiWebUrl}")
    try:
        running.query.awaitTermination()
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        running.stop()


@app.command("demo")
def demo(messages: int = typer.Option(200, min=1, help="How many messages the demo platform writes.")) -> None:
    """Start the local stack if needed, run a demo workload through the purger, print a report."""
    from rich.console import Console
    from rich.table import Table

    from purger.demo import SCENARIOS, run_demo

    _stack_up(load_config())
    report = run_demo(messages=messages)
    table = Table(title=f"Purge demo: {messages} messages, {report.seconds:.0f} s")
    table.add_column("what")
    table.add_column("expected", justify="right")
    table.add_column("observed", justify="right")
    for name, (expected, observed) in report.scenarios.items():
        outcome = "purged" if SCENARIOS[name][1] else "kept"
        table.add_row(f"{name}: messages {outcome}", str(expected), str(observed))
    table.add_row("payloads purged (row and every blob)", str(report.payloads_expected_gone), str(report.payloads_gone))
    table.add_row("payloads kept (still referred to)", str(report.payloads_expected_kept), str(report.payloads_kept))
    for dc, left in sorted(report.blobs_left.items()):
        table.add_row(f"blobs of purged payloads left in {dc}", "0", str(left))
    for (kind, status), count in sorted(report.sink_totals.items()):
        table.add_row(f"sink: {kind} {status}", "", str(count))
    Console().print(table)
    if not report.ok:
        typer.echo("the demo's end state is not the expected one", err=True)
        raise typer.Exit(1)
