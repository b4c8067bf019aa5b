"""The purge job through spark-submit on the local standalone cluster (``devstack.cluster``).

A master and two workers on 127.0.0.1 (1 core each); the job is submitted in client mode with
the code in a ``--py-files`` zip, so the executors run what the driver shipped. The test
configuration's periods are conftest's: expired_ttl 6s, deleted_ttl 1s, payload_grace 3s,
trigger 1s, watermark delay 2s, clock every 1s. Startup is slow on a small machine (three JVMs
for the cluster, then the driver and two executors), so the timeouts are generous.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from typer.testing import CliRunner

from devstack.cluster import (
    EXECUTOR_MEMORY, HOST, MASTER_URL, WORKER_CORES, WORKER_PORTS, SparkCluster, executor_pids, master_state, submit,
    worker_state,
)
from purger.cli import app
from purger.config import load_config
from purger.connectors import cassandra_session
from purger.submit import PACKAGES_ZIP
from simulation.mailbox import Platform
from devstack.stack import prepare
from purger.sinks.ledger import Ledger
from tests.support.configs import free_port, mailbox, toml
from tests.support import ROOT
from tests.support.faults import FAULTS
from tests.support.mailbox import deletable
from tests.support.waits import ago, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    """The local standalone cluster; stopped afterwards if this module started it."""
    cluster = SparkCluster()
    started_here = not cluster.running()
    cluster.up()
    yield cluster
    if started_here:
        cluster.down()


def job_config(servers, base: Path, name: str, own: str | None = None, **stream: object) -> Path:
    """A job's configuration file: topics and checkpoint of its own, conftest's short periods. ``own``: a keyspace
    and buckets of its own by that name, reconciled at the start (orphans past a grace of seconds); without one,
    the session's, never reconciled."""
    raw: dict = {
        "kafka": {
            "topics": [f"test.{name}.events"],
            "control_topic": f"test.{name}.control",
            "dead_letter_topic": f"test.{name}.dead-letter",
            "reconcile_topic": f"test.{name}.reconcile",
        },
        "policies": {"mailbox": {"expired_ttl": "6s", "incomplete_ttl": "8s", "deleted_ttl": "1s",
                                 "payload_grace": "3s"}},
        "stream": {
            "checkpoint": str(base / "checkpoint"),
            "trigger_interval": "1s",
            "watermark_delay": "2s",
            "clock_interval": "1s",
            "retry_interval": "2s",
            "retry_cap": "10s",
            "shuffle_partitions": 2,
            **stream,
        },
        "ledger": {"path": str(base / "ledger" / "records"), "report_path": str(base / "ledger" / "report"),
                   "reconcile_path": str(base / "ledger" / "reconcile_report")},
        "metrics": {"port": 0},  # no endpoint: another purger on this machine may have the port
        "reconcile": {"interval": "0"},  # the keyspace is the other tests' too
    }
    if own:
        raw["cassandra"] = {"keyspace": own.replace("-", "_")}
        raw["stores"] = {dc: {"bucket": f"{own}-{dc}"} for dc in ("dc1", "dc2")}
        # A task per core and range: the tables are small, and a scan's tasks wait for the batches' cores.
        raw["reconcile"] = {"interval": "1h", "orphan_grace": "2s", "orphan_grace_check": False, "tasks_per_core": 1,
                            "ranges_per_task": 1}
    path = base / "purger.toml"
    path.write_text(toml(raw))
    prepare(load_config(path), partitions=2)
    return path


# How long the driver takes at most to count a killed executor's tasks as failed (its heartbeat timeout is
# longer, but a killed JVM's connections close at once).
KILL_SEEN_S = 30


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _application_id(ui_port: int, submission, timeout_s: float = 300) -> str:
    """The submitted application's id, once its driver's UI answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert submission.running(), f"spark-submit exited:\n{submission.log_tail()}"
        try:
            return _get(f"http://127.0.0.1:{ui_port}/api/v1/applications")[0]["id"]
        except (OSError, ValueError, IndexError):
            assert time.monotonic() < deadline, f"no Spark UI after {timeout_s}s:\n{submission.log_tail()}"
            time.sleep(1)


def test_a_purge_through_spark_submit_runs_in_the_executors_and_loses_nothing_when_they_are_killed(
        cluster, servers, run_id, tmp_path, spark):
    """The line `purger submit-line` prints, run as a user would copy it: the application gets an executor on
    each worker, its tasks (the deletions among them) run there from the code the driver shipped, and SIGTERM
    stops it cleanly. Meanwhile executors' JVMs are killed with SIGKILL in the middle of batches that delete
    (``FaultMatrix.executor_kills``: three in full, one bounded): Spark runs the lost tasks again (task and
    stage retries) and a new executor takes the worker's place. A kill that lands between two tasks fails
    none and is followed by another (two more at most). Counted at the end: live objects deleted, due ones
    left, and ledger records missing or doubled, each 0. The executors' Python has only the zip (the purger
    installed there is hidden from it), and the reconcile at the start finds due messages no event told of and
    an orphan blob in each data centre, deleted in the executors. One submission for all: the cluster's driver
    and executors are the slowest JVMs of the suite to start."""
    run = uuid.uuid4().hex[:6]
    # Capped so that each batch deletes for 15 s or more: the kills, a new executor's start between them, fit.
    config_path = job_config(servers, tmp_path, f"{run_id}.cluster", own=f"cluster-{run}", max_deletions_per_second=10)
    config = load_config(config_path)
    r = mailbox(config)
    platform = Platform(config)
    # What only the reconcile at the start finds: due messages whose events went to a topic the purger does not
    # read, and a blob no payloads row names, in both data centres.
    unread = config.model_copy(update={"kafka": config.kafka.model_copy(update={"topics": [f"test.{run}.unread"]})})
    prepare(unread, partitions=1)
    quiet = Platform(unread)
    orphan = f"orphan-{run}"
    try:
        eligible = {m: f"p-{m}" for m in deletable(platform, config, FAULTS.executor_kill_objects, f"kills-{run}")}
        eligible |= {m: f"p-{m}" for m in deletable(quiet, config, 2, f"unread-{run}")}
        for dc, store in config.stores.items():
            quiet.stores[dc].put_object(Bucket=store.bucket, Key=f"payloads/{orphan}", Body=b"left behind")
        for i in range(2):  # due by their counter, besides the deleted ones
            m = f"cluster-{run}-counter-{i}"
            eligible[m] = platform.enqueue(m, f"p-{m}", extract_count=2, at=ago(r.expired_ttl))
            platform.dequeue(m, 0, at=ago(r.expired_ttl))
        live = {}
        for i in range(5):
            m = f"cluster-{run}-live-{i}"
            live[m] = platform.enqueue(m, f"p-{m}", extract_count=1)
        platform.flush()

        def left() -> int:
            """Deletions still to come, rows and payloads apart (the orphan's blobs one more): it falls while the
            messages go, before any payload's grace has passed, as well as after."""
            return (sum((platform.row(m) is not None) + (not platform.payload_gone(p)) for m, p in eligible.items())
                    + (not platform.payload_gone(orphan)))

        ui_port = free_port()
        log_file = tmp_path / "spark-submit.log"
        # Exactly the line `purger submit-line` prints for this cluster, as a user would copy it.
        # The executors' Python has the purger installed: hidden from their workers (tests/support/zip_only_site),
        # so that they run what the zip holds, as on a cluster that has only the zip.
        zip_only, imported = ROOT / "tests" / "support" / "zip_only_site", tmp_path / "imported-from"
        printed = CliRunner().invoke(app, [
            "submit-line", "--master", MASTER_URL, "--config", str(config_path), "--workdir",
            str(tmp_path / "submit"), "--executor-memory", EXECUTOR_MEMORY, "--total-cores",
            str(len(WORKER_PORTS) * WORKER_CORES), "--driver-host", HOST, "--conf", f"spark.executor.cores={WORKER_CORES}",
            "--conf", f"spark.ui.port={ui_port}", "--conf", f"spark.executorEnv.PYTHONPATH={zip_only}",
            "--conf", f"spark.executorEnv.PURGER_ZIP_ONLY_MARKER={imported}"])
        assert printed.exit_code == 0, printed.output
        submission = submit(log_file=log_file, command=shlex.split(printed.stdout.strip().splitlines()[-1]))
        kills, started = 0, time.monotonic()
        deadline, killed_at = started + 900, 0.0
        try:
            app_id = _application_id(ui_port, submission)
            ui = f"http://127.0.0.1:{ui_port}/api/v1/applications/{app_id}"

            def failed_tasks() -> int:
                return sum(e["failedTasks"] for e in _get(f"{ui}/allexecutors"))

            last_left = 2 * len(eligible)
            while (now_left := left()) > 0:
                assert submission.running(), f"spark-submit exited:\n{submission.log_tail()}"
                assert time.monotonic() < deadline, f"{now_left} due objects left; log:\n{submission.log_tail()}"
                # In the middle of deleting: some went since the last kill, and some are left. Another kill only
                # when the last failed no task, once the driver had the time to see the executor lost.
                wanted = kills < FAULTS.executor_kills or (
                    kills < FAULTS.executor_kills + 2 and time.monotonic() - killed_at > KILL_SEEN_S
                    and failed_tasks() == 0)
                if wanted and now_left <= last_left - 10 and (pids := executor_pids(app_id)):
                    os.kill(pids[kills % len(pids)], signal.SIGKILL)
                    kills, last_left, killed_at = kills + 1, now_left, time.monotonic()
                time.sleep(0.5)
            print(f"eligible rows and blobs gone {time.monotonic() - started:.0f}s after spark-submit started")
            failed = failed_tasks()

            # The application runs on the cluster, with an executor on each worker (a killed one's replaced)...
            assert app_id in [a["id"] for a in master_state()["activeapps"]]

            def on_workers() -> list[list[str]]:
                return [[e["id"] for e in worker_state(w)["executors"] if e["appid"] == app_id] for w in (0, 1)]

            wait_for(lambda: all(len(ids) == 1 for ids in on_workers()), 120, "an executor on each worker")
            # Each executor fetched the code from the driver: the --py-files zip is in its work directory.
            for worker, [executor_id] in zip(cluster.processes.servers[1:], on_workers()):
                assert (worker.home / "work" / app_id / str(executor_id) / PACKAGES_ZIP).is_file()
            # Their workers imported the purger from that zip alone.
            origins = set(imported.read_text().split())
            assert origins and all(f"/{PACKAGES_ZIP}/purger/" in o for o in origins), origins
            # ... and the tasks, the deletions among them, ran in executors, not in the driver.
            executors = {e["id"]: e for e in _get(f"{ui}/allexecutors")}
            assert executors["driver"]["totalTasks"] == 0
            ran = [i for i, e in executors.items() if i != "driver" and e["completedTasks"] > 0]
            assert len(ran) >= 2, f"executors that ran tasks: {ran}"
            driver_pid = submission.driver_pid()
        finally:
            exit_code = submission.stop()  # SIGTERM to spark-submit, as docs/operations.md says
        assert exit_code == 0, f"spark-submit did not stop cleanly ({exit_code}):\n{submission.log_tail()}"
        output = log_file.read_text(errors="replace")
        assert "stopped cleanly" in output and "Traceback" not in output, submission.log_tail(80)
        finished = {a["id"]: a["state"] for a in master_state()["completedapps"]}
        assert finished.get(app_id) == "FINISHED", finished
        print(f"{kills} executors killed, {failed} tasks failed and ran again; spark-submit log:\n"
              + "\n".join(line for line in submission.log_tail(400).splitlines() if "purger" in line))
        assert kills >= FAULTS.executor_kills and failed >= 1  # the kills came in the middle of tasks

        wrongly_deleted = [m for m, p in live.items() if platform.row(m) is None or not platform.payload_intact(p)]
        deletions = Ledger(spark, config.ledger).records().where(F.col("status") == "purged").collect()
        records = Counter((r["kind"], r["id"], r["dc"]) for r in deletions)
        expected = {("message", m, None) for m in eligible} | {("payload", p, dc) for p in eligible.values()
                                                                 for dc in (None, "dc1", "dc2")}
        expected |= {("payload", orphan, dc) for dc in ("dc1", "dc2")}  # the reconcile's orphan sweep, in executors
        missing = expected - set(records)
        doubled = {key: n for key, n in records.items() if n > 1}
        assert (wrongly_deleted, left(), sorted(missing, key=str), doubled) == ([], 0, [], {})
        # The ledger names the process of each deletion: executor processes, none of them the driver.
        workers = {r["worker"].rsplit(":", 1)[1] for r in deletions}
        assert str(driver_pid) not in workers and workers, workers
    finally:
        platform.close()
        quiet.close()
        session = cassandra_session(config.cassandra)
        session.execute(f"DROP KEYSPACE IF EXISTS {config.cassandra.keyspace}", timeout=60)
        session.cluster.shutdown()
