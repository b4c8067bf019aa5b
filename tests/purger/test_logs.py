"""The purger's logs and the names of its jobs: a line per batch with its counts, Spark's per-key noise
switched off, ``--log-level``, and each batch's jobs named in the Spark UI."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest

from purger.core.settings import PurgerConfig
from purger.core.lags import Lags
from purger.core.vocabulary import ALREADY_GONE, DEAD_LETTERED, ERROR, PURGED, SKIPPED, WOULD_DELETE
from purger.logs import LogLevel, set_spark_log_level
from simulation.mailbox import Platform
from purger.sinks.ledger import Ledger
from purger.sinks.sink import batch_summary
from tests.support.configs import own_config, write_config
from tests.support.waits import wait_for
from tests.support.mailbox import deletable
from tests.support import ROOT

BATCH_LINE = re.compile(
    r"INFO purger\.sinks\.sink: batch (?P<batch>\d+): (?P<candidates>\d+) candidates, (?P<purged>\d+) purged, "
    r"(?:(?P<would_delete>\d+) would be deleted, )?(?:(?P<already_gone>\d+) already gone, )?"
    r"(?P<skipped>\d+) skipped, (?P<error>\d+) errors, (?P<dead_lettered>\d+) dead-lettered")
# Spark's warnings per key (every new object's empty state), per batch (one longer than the trigger interval)
# and per block computed twice: thousands of lines in a two-minute run before log4j2.properties.
NOISE = ("Value state message doesn't contain a value", "Current batch is falling behind",
         "already exists on this machine")


def test_the_batch_line_counts_outcomes_by_status_over_kinds():
    counts = {("message", PURGED): 3, ("payload", PURGED): 9, ("message", SKIPPED): 2,
              ("payload", ERROR): 1, ("dead_letter", DEAD_LETTERED): 4}
    # The least lag 99% of them are at most, as the sketch ranks them (numpy's interpolation said 2 s).
    line = batch_summary(7, counts, Lags.of([1.0] * 99 + [101.0]), 2.345)
    assert line == ("batch 7: 19 candidates, 12 purged, 2 skipped, 1 errors, 4 dead-lettered, lag p99 1 s, "
                    "in 2.3 s")
    assert BATCH_LINE.search(f"INFO purger.sinks.sink: {line}")["purged"] == "12"


def test_the_batch_line_shows_a_dry_runs_and_a_replays_statuses_only_when_there_are_some():
    line = batch_summary(0, {("message", WOULD_DELETE): 2, ("payload", ALREADY_GONE): 1}, Lags(), 0.5)
    assert line == ("batch 0: 3 candidates, 0 purged, 2 would be deleted, 1 already gone, 0 skipped, 0 errors, "
                    "0 dead-lettered, in 500 ms")
    assert BATCH_LINE.search(f"INFO purger.sinks.sink: {line}")["would_delete"] == "2"


def test_only_the_state_set_up_workers_stdout_is_silenced():
    """Spark runs ``python -m pyspark.sql.streaming.transform_with_state_driver_worker``, which prints its progress;
    imported there, the purger's processor sends its stdout to /dev/null. Anywhere else it changes nothing."""
    script = ("import sys, types\n"
              "sys.modules['__main__'].__spec__ = types.SimpleNamespace(name=sys.argv[1])\n"
              "print('before', flush=True)\n"
              "import purger.streams.processor\n"
              "print('after', flush=True)\n"
              "print('an error', file=sys.stderr)\n")
    for main, shown in (("pyspark.sql.streaming.transform_with_state_driver_worker", "before\n"),
                        ("pyspark.worker", "before\nafter\n")):
        run = subprocess.run([sys.executable, "-c", script, main], capture_output=True, text=True, timeout=120)
        assert (run.returncode, run.stdout, run.stderr) == (0, shown, "an error\n"), run.stderr


def test_spark_logs_at_the_level_given_from_its_jvms_start():
    """The level is a system property the Log4j configuration reads (with warn when it is not given), so the
    JVM's first lines already obey it: `purger report` and `purger pending` start theirs at ERROR."""
    from purger.logs import LOG4J2_CONFIGURATION, log4j2_options

    assert "rootLogger.level = ${sys:purger.spark.level:-warn}" in LOG4J2_CONFIGURATION.read_text()
    options = log4j2_options("ERROR")
    assert options["spark.driver.extraJavaOptions"].endswith(" -Dpurger.spark.level=ERROR")
    assert options["spark.executor.extraJavaOptions"] == options["spark.driver.extraJavaOptions"]


@pytest.mark.integration
def test_purger_report_prints_none_of_sparks_start_warnings(tmp_path):
    """A read-only command's JVM logs at ERROR from its start: no warning about the host or the UI's port."""
    (tmp_path / "purger.toml").write_text(f'[ledger]\npath = "{tmp_path}/ledger"\nreport_path = "{tmp_path}/report"\n')
    run = subprocess.run([sys.executable, "-c", "from purger.cli import app; app()", "report",
                          "--config", str(tmp_path / "purger.toml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("no ledger records for "), run.stdout
    # The JVM's own line (Spark's launcher adds the incubating vector module), which no log setting reaches.
    assert [line for line in run.stderr.splitlines() if line.strip()
            and line != "WARNING: Using incubator modules: jdk.incubator.vector"] == [], run.stderr


@pytest.mark.parametrize("level, spark_level", [(LogLevel.DEBUG, "WARN"), (LogLevel.INFO, "WARN"),
                                                (LogLevel.WARNING, "WARN"), (LogLevel.ERROR, "ERROR")])
def test_spark_logs_at_warn_unless_the_purgers_level_is_higher(level, spark_level):
    levels: list[str] = []
    set_spark_log_level(SimpleNamespace(sparkContext=SimpleNamespace(setLogLevel=levels.append)), level)
    assert levels == [spark_level]


# --- a purger of its own process ----------------------------------------------------------------------


def run_until(config_file: Path, log: Path, done: Callable[[], bool], *options: str) -> list[str]:
    """Run `python -m purger.job` until ``done()``, stop it with SIGTERM, and return what it printed."""
    with log.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "purger.job", "--config", str(config_file), *options],
                                   cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: done() or process.poll() is not None, timeout_s=300, what="the purger's deletions")
        assert process.poll() is None, f"the purger ended ({process.returncode}):\n{log.read_text()[-3000:]}"
    finally:
        process.terminate()  # the driver alone: it stops the query between batches (purger.cli)
        try:
            assert process.wait(timeout=120) == 0
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # PySpark's worker daemon, if it outlived the driver
            except ProcessLookupError:
                pass
    return log.read_text().splitlines()


def ledger_counts(spark, config: PurgerConfig) -> dict[int, Counter[str]]:
    """The ledger's records per batch, by status."""
    per_batch: dict[int, Counter[str]] = {}
    for r in Ledger(spark, config.ledger).records().groupBy("batch_id", "status").count().collect():
        per_batch.setdefault(r["batch_id"], Counter())[r["status"]] = r["count"]
    return per_batch


@pytest.mark.parametrize("level, shown", [(LogLevel.INFO, True), (LogLevel.WARNING, False)])
def test_the_batch_line_is_logged_at_info_and_not_at_warning(level, shown):
    """What `--log-level` sets (``log_to_stderr``, before Spark starts), in a process of its own: at WARNING the
    batch lines go, the sink's warnings stay. The run below shows them at INFO from a purger's process."""
    script = ("import logging, sys\n"
              "from purger.logs import LogLevel, log_to_stderr\n"
              "log_to_stderr(LogLevel(sys.argv[1]))\n"
              "sink = logging.getLogger('purger.sinks.sink')\n"
              f"sink.info({batch_summary(3, {('message', PURGED): 1}, Lags(), 0.5)!r})\n"
              "sink.warning('a warning')\n")
    run = subprocess.run([sys.executable, "-c", script, level.value], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert bool(BATCH_LINE.search(run.stderr)) == shown and "WARNING purger.sinks.sink: a warning" in run.stderr, (
        run.stderr)


@pytest.mark.integration
def test_a_run_logs_one_line_per_batch_and_no_per_key_warnings(spark, config, tmp_path_factory):
    """A purger in its own process logs each batch's counts in one line, which match its ledger records,
    and little else: not Spark's warning per key."""
    tmp = tmp_path_factory.mktemp("logs")
    own = own_config(config, tmp, "logs")
    own = own.model_copy(update={"metrics": own.metrics.model_copy(update={"port": 0})})
    config_file = write_config(own, tmp / "purger.toml")
    platform = Platform(own)
    try:
        messages = deletable(platform, own, 3, "logs")
        lines = run_until(config_file, tmp / "purger.log",
                          lambda: all(platform.row(m) is None and platform.payload_gone(f"p-{m}") for m in messages))
    finally:
        platform.close()
    text = "\n".join(lines)
    assert not [noise for noise in NOISE if noise in text], text

    logged = {int(m["batch"]): m for m in map(BATCH_LINE.search, lines) if m}
    ledger = ledger_counts(spark, own)
    assert set(logged) == set(ledger), text
    for batch, m in logged.items():
        counts = ledger[batch]
        assert int(m["candidates"]) == sum(counts.values()), m.group(0)
        for status in (PURGED, SKIPPED, ERROR, DEAD_LETTERED):
            assert int(m[status]) == counts[status], (status, m.group(0))
    # Each message's row and payload_refs row, and its payload's row and two blobs.
    assert sum(int(m[PURGED]) for m in logged.values()) == 5 * len(messages)
    # Besides the batch lines, a few at start and stop: the command's own, Spark's advice on the host, and what
    # the Python worker that sets the stateful stage up prints (once per query start).
    other = [line for line in lines if line.strip() and not BATCH_LINE.search(line)]
    assert len(other) <= 15, text
    # Of what the Python worker that sets the stateful stage up prints, only its first line (before the purger's
    # code runs there): not the UDF's schema (purger.streams.processor.quiet_state_setup_worker).
    assert not [line for line in lines if "TransformWithStateInPandas Python worker" in line
                and not line.startswith("Starting ")], text
    # The stop's last word.
    assert re.fullmatch(r"stopped cleanly after batch \d+", lines[-1].strip()), text



def test_a_round_beside_the_query_whose_server_does_not_answer_logs_one_line(caplog):
    """The rounds beside the query (the stuck objects' count, the report, the upkeep) meet Cassandra not answering
    as one line naming the address, not a stack trace; other failures keep theirs."""
    import threading

    from purger.connectors.errors import ServerUnavailable
    from purger.running import Every

    line = "Cassandra at 127.0.0.1:9042 does not answer (timed out): check cassandra.hosts"
    rounds = threading.Event()

    def unanswered() -> None:
        rounds.set()
        raise ServerUnavailable(line)

    with caplog.at_level("WARNING", logger="purger.running"):
        every = Every(0.01, unanswered, "purger-stuck")
        assert rounds.wait(10)
        every.join()
    said = [r for r in caplog.records if r.name == "purger.running"]
    assert said and all(r.getMessage() == f"purger-stuck: {line}; the next round tries again" and r.exc_info is None
                        for r in said)
