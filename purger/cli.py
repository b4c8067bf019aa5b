"""The `purger` command.

    purger stack up|down|status   the local Kafka, Cassandra and S3Proxy
    purger run [--config F]       the streaming purge job, until interrupted
    purger demo                   a demo workload through the local stack, with a report
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from purger.config import ConfigError, load_config

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


@stack_app.command("up")
def stack_up(config: Optional[Path] = ConfigOption) -> None:
    """Fetch the jars (cached), start every server, wait until each answers, create topics, schema, buckets."""
    from purger.stack import LocalStack, StackError

    try:
        LocalStack().up(_config(config))
    except StackError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(1) from None


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
