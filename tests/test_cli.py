"""The command's signal handling: a signal only sets an event, which the run loop checks between calls."""

from __future__ import annotations

import os
import signal

from purger.cli import _set_on_signals


def test_the_first_signal_sets_the_stop_event_and_raises_nothing():
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        stop_requested = _set_on_signals(signal.SIGUSR1)
        assert not stop_requested.is_set()
        os.kill(os.getpid(), signal.SIGUSR1)  # delivered to this (main) thread before kill returns
        assert stop_requested.is_set()
    finally:
        signal.signal(signal.SIGUSR1, previous)


# --- purger schema ------------------------------------------------------------------------------------


def test_schema_prints_each_enabled_policys_reference_cql_under_the_configured_names(tmp_path):
    from typer.testing import CliRunner

    from purger.cli import app

    config_file = tmp_path / "purger.toml"
    config_file.write_text('[cassandra]\nkeyspace = "platform"\njournal_table = "own_journal"\n\n'
                           '[policies.mailbox]\npayloads_table = "blobs"\n\n'
                           '[policies.rule_events]\nenabled = true\n')
    result = CliRunner().invoke(app, ["schema", "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    cql = result.stdout
    for table in ("messages", "payload_refs", "blobs", "rule_events", "own_journal"):
        assert f"CREATE TABLE IF NOT EXISTS platform.{table} (" in cql
    assert "platform.payloads " not in cql and "{" not in cql  # renamed, and nothing left unrendered
    assert "platform.users" not in cql  # a policy not enabled
    assert cql.count("CREATE TABLE") == cql.count(";") == 5  # one statement each, ready for cqlsh


def test_schema_with_a_bad_configuration_exits_2_naming_the_key(tmp_path):
    from typer.testing import CliRunner

    from purger.cli import app

    config_file = tmp_path / "purger.toml"
    config_file.write_text('[cassandra]\nkeyspce = "platform"\n')
    result = CliRunner().invoke(app, ["schema", "--config", str(config_file)])
    assert result.exit_code == 2
    assert "cassandra.keyspce: unknown key; did you mean keyspace?" in result.stderr


# --- purger run: what it prints around the run ------------------------------------------------------


def test_run_with_servers_that_do_not_answer_prints_one_line_each_and_no_client_tracebacks(tmp_path):
    """No server at any address: `purger run` exits 2 with the checks' lines, as `purger setup` does, and none of
    the client libraries' own logs (the Cassandra driver's tracebacks, kafka-python's retries), although
    `run` sends other libraries' warnings to stderr."""
    from typer.testing import CliRunner

    from purger.cli import app
    from tests.support.configs import free_port

    kafka, cassandra, s3 = free_port(), free_port(), free_port()
    config_file = tmp_path / "purger.toml"
    config_file.write_text(f'[kafka]\nbootstrap_servers = "127.0.0.1:{kafka}"\n\n[cassandra]\nport = {cassandra}\n\n'
                           f'[stores.dc1]\nbucket = "dc1"\nendpoint = "http://127.0.0.1:{s3}"\n')
    overrides = {"PURGER_KAFKA_BOOTSTRAP": None, "PURGER_CASSANDRA_HOSTS": None, "PURGER_S3_ENDPOINT": None}
    result = CliRunner().invoke(app, ["run", "--config", str(config_file)], env=overrides)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["Kafka", "Cassandra", "S3"], result.stderr
    assert all("does not answer" in line for line in lines), result.stderr


def test_the_runs_last_line_says_whether_it_stopped_cleanly_and_after_which_batch():
    from types import SimpleNamespace

    from purger.cli import how_it_stopped

    def running(last_batch, cleanly=True, failure=None):
        return SimpleNamespace(sink=SimpleNamespace(last_batch=last_batch), stopped_cleanly=cleanly, failure=failure)

    assert how_it_stopped(running(41)) == "stopped cleanly after batch 41"
    assert how_it_stopped(running(None)) == "stopped cleanly before its first batch"
    assert how_it_stopped(running(7, cleanly=False)).startswith("stopped after batch 7, cutting the next batch")
    assert how_it_stopped(running(7, failure=RuntimeError("Kafka went away\nat ..."))) == (
        "stopped after batch 7: the query failed: Kafka went away")
