"""Configurations of a test's own: topics, checkpoint and ledger that no other test shares."""

from __future__ import annotations

import json
import socket
import uuid
from datetime import timedelta
from pathlib import Path

from pydantic import SecretStr

from purger.core.settings import MetricsConfig, PurgerConfig
from devstack.stack import prepare
from purger.policies.mailbox import MailboxSettings


def mailbox(config: PurgerConfig) -> MailboxSettings:
    """The mailbox policy's section of a configuration: its periods and tables."""
    return config.policy_set.policy_of("message").settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The daily report's interval where a test does not read it: each round re-reads the day's ledger (5-7 s of
# jobs here), and every 2 s it took 40% of the Spark jobs' time of a module with a purger running.
UNREAD_REPORT = timedelta(minutes=10)


def own_config(config: PurgerConfig, tmp: Path, name: str, report_interval: timedelta = UNREAD_REPORT,
               **stream) -> PurgerConfig:
    """The session's configuration with topics (created here), checkpoint, ledger and metrics port of its
    own; ``report_interval``: the daily report's, short where a test reads the report the purger writes;
    ``stream`` overrides `[stream]` keys."""
    run = f"{name}.{uuid.uuid4().hex[:8]}"
    own = config.model_copy(update={
        "kafka": config.kafka.model_copy(update={
            "topics": [f"test.{run}.events"], "control_topic": f"test.{run}.control",
            "dead_letter_topic": f"test.{run}.dead-letter", "reconcile_topic": f"test.{run}.reconcile"}),
        "stream": config.stream.model_copy(update={"checkpoint": str(tmp / "checkpoint"), **stream}),
        "ledger": config.ledger.model_copy(update={
            "path": str(tmp / "ledger"), "report_path": str(tmp / "report"), "reconcile_path": str(tmp / "reconcile"),
            "report_interval": report_interval}),
        "metrics": MetricsConfig(port=free_port()),
    })
    prepare(own, partitions=2)
    return own


def toml(raw: dict, prefix: str = "") -> str:
    """Enough TOML for a configuration: tables of strings, numbers, booleans and lists of strings."""
    lines, tables = [], []
    for key, value in raw.items():
        if isinstance(value, dict):
            tables.append(toml(value, f"{prefix}{key}."))
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        else:  # str, int, float, list of str: JSON spells them as TOML does
            lines.append(f"{key} = {json.dumps(value)}")
    head = [f"[{prefix[:-1]}]"] if prefix and lines else []
    return "\n".join([*head, *lines, "", *tables])


def write_config(config: PurgerConfig, path: Path, secrets: bool = True, leaving_out: frozenset[str] = frozenset()
                 ) -> Path:
    """The configuration as a TOML file, for a purger in another process; without ``secrets``, the file has
    no password or secret key (the process is to take them from its environment); ``leaving_out``: keys
    (``section.key``; ``stores.*.key`` for a key of every store) an earlier release does not know, at their
    defaults."""
    def left_out(key: str) -> bool:
        section, _, rest = key.partition(".")
        return key in leaving_out or f"{section}.*.{rest.partition('.')[2]}" in leaving_out

    def plain(value, at=""):
        if isinstance(value, dict):
            return {k: plain(v, f"{at}{k}.") for k, v in value.items()
                    if v is not None and (secrets or not isinstance(v, SecretStr)) and not left_out(f"{at}{k}")}
        if isinstance(value, timedelta):
            return value.total_seconds()
        if isinstance(value, SecretStr):
            return value.get_secret_value()
        return value

    path.write_text(toml(plain(config.model_dump())))
    return path
