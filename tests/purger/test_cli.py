"""The command's signal handling: a signal only sets an event, which the run loop checks between calls."""

from __future__ import annotations

import os
import re
import signal

import pytest

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
    config_file.write_text('[cassandra]\nkeyspace = "platform"\njournal_table = "own_journal"\n'
                           'holds_table = "own_holds"\nfailures_table = "own_failures"\n'
                           'restorations_table = "own_restorations"\nrestoration_names_table = "own_names"\n\n'
                           '[policies.mailbox]\npayloads_table = "blobs"\n\n'
                           '[policies.rule_events]\nenabled = true\n')
    result = CliRunner().invoke(app, ["schema", "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    cql = result.stdout
    for table in ("messages", "payload_refs", "blobs", "rule_events", "own_journal", "own_holds",
                  "own_failures", "own_restorations", "own_names"):
        assert f"CREATE TABLE IF NOT EXISTS platform.{table} (" in cql
    # Renamed, and no placeholder left unrendered (the journal's compaction map is CQL's own braces).
    assert "platform.payloads " not in cql and not re.search(r"\{\w*\}", cql)
    assert "platform.users" not in cql  # a policy not enabled
    assert cql.count("CREATE TABLE") == cql.count(";") == 9  # one statement each, ready for cqlsh


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


# --- purger submit-line -------------------------------------------------------------------------------


def test_submit_line_prints_the_spark_submit_line_with_what_a_cluster_needs(tmp_path):
    """What the line ships and sets (the cluster test, tests/integration/test_cluster.py, submits exactly such a
    line)."""
    import shlex
    import sys
    import zipfile
    from pathlib import Path

    from typer.testing import CliRunner

    import purger.job
    from purger.cli import app

    config_file = tmp_path / "purger.toml"
    config_file.write_text('[stream]\ndriver_memory = "3g"\n')
    result = CliRunner().invoke(app, ["submit-line", "--master", "spark://10.0.0.5:7077", "--config", str(config_file),
                                      "--workdir", str(tmp_path / "submit"), "--driver-host", "10.0.0.9",
                                      "--conf", "spark.ui.port=4999", "--dry-run"])
    assert result.exit_code == 0, result.output
    line = shlex.split(result.stdout.strip().splitlines()[-1])
    options = dict(zip(line[1:], line[2:]))
    assert Path(line[0]).name == "spark-submit" and options["--master"] == "spark://10.0.0.5:7077"
    assert options["--deploy-mode"] == "client" and options["--driver-memory"] == "3g"
    jars = options["--jars"].split(",")
    assert all(Path(jar).is_file() for jar in jars)
    assert any("spark-sql-kafka-0-10" in jar for jar in jars) and any("delta-spark" in jar for jar in jars)
    names = zipfile.ZipFile(options["--py-files"]).namelist()
    assert {"purger/job.py", "purger/core/policy.py", "purger/streams/processor.py"} <= set(names)
    settings = dict(line[i + 1].split("=", 1) for i, word in enumerate(line) if word == "--conf")
    assert settings["spark.pyspark.python"] == settings["spark.pyspark.driver.python"] == sys.executable
    assert settings["spark.driver.host"] == "10.0.0.9" and settings["spark.ui.port"] == "4999"
    assert "log4j2.configurationFile" in settings["spark.driver.extraJavaOptions"]
    main = line.index(str(Path(purger.job.__file__).resolve()))
    assert line[main + 1:] == ["--config", str(config_file.resolve()), "--dry-run"]

    # The same line as JSON, for a script: the command's words, and the line as printed.
    import json

    as_json = CliRunner().invoke(app, ["submit-line", "--master", "spark://10.0.0.5:7077", "--config", str(config_file),
                                       "--workdir", str(tmp_path / "submit"), "--driver-host", "10.0.0.9",
                                       "--conf", "spark.ui.port=4999", "--dry-run", "--json"])
    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.stdout)
    assert document["command"] == line and shlex.split(document["line"]) == line


def test_submit_line_with_a_conf_that_is_not_key_value_exits_2_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from purger.cli import app

    result = CliRunner().invoke(app, ["submit-line", "--master", "yarn", "--conf", "spark.ui.port"])
    assert result.exit_code == 2 and result.output.strip() == "--conf takes KEY=VALUE: spark.ui.port"


def test_schema_with_replication_prints_the_keyspaces_create_keyspace_first(tmp_path):
    from typer.testing import CliRunner

    from purger.cli import app

    config_file = tmp_path / "purger.toml"
    config_file.write_text('[cassandra]\nkeyspace = "platform"\n')
    result = CliRunner().invoke(app, ["schema", "--config", str(config_file), "--replication", "dc1:3,dc2:3"])
    assert result.exit_code == 0, result.output
    statements = [line for line in result.stdout.splitlines() if line.startswith("CREATE ")]
    assert statements[0] == ("CREATE KEYSPACE IF NOT EXISTS platform WITH replication = "
                             "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 3};")
    bad = CliRunner().invoke(app, ["schema", "--replication", "dc1:three"])
    assert bad.exit_code == 2 and bad.output.strip() == (
        "--replication takes DC:REPLICAS,... (e.g. dc1:3,dc2:3); 'dc1:three' is not one")


@pytest.mark.parametrize("command", ["reconcile", "replay", "hold message:m1", "release message:m1",
                                     "erase mailbox:alice", "restore --policy mailbox --since 2026-12-06"])
def test_a_command_that_changes_what_is_deleted_without_a_reason_exits_2_in_one_line(tmp_path, command):
    from typer.testing import CliRunner

    from purger.cli import app

    # Refused before the configuration is read or anything starts: the file does not even exist.
    result = CliRunner().invoke(app, [*command.split(), "--config", str(tmp_path / "absent.toml"), "--actor", "jdoe"])
    command = command.split()[0]
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"purger {command} changes what is deleted: say why with --reason (a ticket, an incident); the ledger "
        "records it with who ran it (--actor, by default the OS user)"]


@pytest.mark.parametrize("scope, line", [
    ("mailbox", "scope 'mailbox': write KIND:ID, e.g. mailbox:alice or message:m1"),
    ("user:u1", "scope user:u1: no enabled policy names a scope of kind 'user'; the kinds are mailbox, message"),
])
def test_a_hold_on_a_scope_no_enabled_policy_names_exits_2_in_one_line_before_anything_starts(tmp_path, scope, line):
    from typer.testing import CliRunner

    from purger.cli import app

    result = CliRunner().invoke(app, ["hold", scope, "--reason", "case 42"])
    assert result.exit_code == 2
    assert line in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("arguments, line", [
    (["user:u1"], "subject user:u1: no enabled policy finds objects of a 'user'; the kinds are mailbox"),
    (["--subject", "user:u1"], "subject user:u1: no enabled policy finds objects of a 'user'; the kinds are mailbox"),
    ([], "give the subject once: `purger erase KIND:ID` or `purger erase --subject KIND:ID`"),
    (["mailbox:a", "--subject", "mailbox:b"], "give the subject once"),
    (["mailbox:alice", "--request", "yesterday"],
     "request 'yesterday': give the id an earlier `purger erase` printed (e.g. 20261206-7f3a9c21)"),
])
def test_an_erasure_of_a_subject_no_enabled_policy_finds_exits_2_in_one_line_before_anything_starts(arguments, line):
    from typer.testing import CliRunner

    from purger.cli import app

    result = CliRunner().invoke(app, ["erase", *arguments, "--reason", "GDPR request 12"])
    assert result.exit_code == 2
    assert line in result.output and "Traceback" not in result.output


def test_a_restore_of_a_policy_not_enabled_exits_2_in_one_line_before_anything_starts():
    from typer.testing import CliRunner

    from purger.cli import app

    result = CliRunner().invoke(app, ["restore", "--policy", "users", "--since", "2026-12-06T09:00:00",
                                      "--reason", "period in seconds"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert ("policy 'users' is not enabled in this configuration: restore one of mailbox (--policy)"
            in result.output)


def test_who_runs_a_command_is_the_actor_given_or_the_os_user_and_a_dry_run_needs_no_reason():
    import getpass

    from purger.cli import _who_and_why

    assert _who_and_why("reconcile", "jdoe@example.com", "INC-4711", False) == ("jdoe@example.com", "INC-4711")
    assert _who_and_why("reconcile", None, "INC-4711", False) == (getpass.getuser(), "INC-4711")
    assert _who_and_why("replay", None, None, True) == (getpass.getuser(), "")
