"""Shared fixtures: the real servers and one SparkSession for the whole test session.

Endpoints come from the environment when given (PURGER_KAFKA_BOOTSTRAP, PURGER_CASSANDRA_HOSTS,
PURGER_S3_ENDPOINT); otherwise docker-compose.yml is started through testcontainers when a Docker
engine answers; otherwise the local stack (`python -m devstack up`) is started, and stopped at the end
if this session started it. In lanes (``make test``: two pytest-xdist workers, ``tests/support/lanes.py``)
the process that runs the workers provides the servers and the class archive before they start.

A test that uses the servers or a JVM (any of ``INTEGRATION_FIXTURES``, directly or through another
fixture) is marked ``integration`` at collection, so ``pytest -m "not integration"`` runs the plain
Python tests alone: no server, no SparkSession. No fixture here is autouse, and this module starts
nothing when it is imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from urllib.parse import urlsplit

import pytest

from purger.core.settings import PurgerConfig

from purger.config import build_config
from devstack.stack import LocalStack, prepare
from tests.support.faults import TcpProxy
from tests.support import ROOT, lanes

ENDPOINT_VARIABLES = ("PURGER_KAFKA_BOOTSTRAP", "PURGER_CASSANDRA_HOSTS", "PURGER_S3_ENDPOINT")
# The session fixtures that start or reach a server or a JVM: a test that requests one of them, however
# indirectly (a module's fixture on ``config``), is an integration test.
INTEGRATION_FIXTURES = frozenset({"servers", "config", "spark", "secure_kafka_broker", "secure_cassandra_node"})


@pytest.fixture(scope="session")
def spark_jvm_options() -> str:
    """Every Spark JVM the session starts (each `python -m purger.job`, `purger reconcile` and spark-submit)
    compiles with C1 alone: they live for seconds to minutes, and on two cores C2's compiler threads took CPU
    from their first batches; and maps Spark's classes from one class-data sharing archive
    (tests/support/class_archive.py), made once per machine (docs/development.md, "Where the suite's time
    goes"). A value of ``SPARK_SUBMIT_OPTS`` already set is kept."""
    if _OWN_JVM_OPTIONS:
        from tests.support.class_archive import java_options

        os.environ["SPARK_SUBMIT_OPTS"] = java_options()
    return os.environ["SPARK_SUBMIT_OPTS"]


# Whether this session chose the Spark JVMs' options (no SPARK_SUBMIT_OPTS set by whoever ran pytest).
_OWN_JVM_OPTIONS = "SPARK_SUBMIT_OPTS" not in os.environ


def pytest_configure(config):
    """C1 alone from the start (``spark_jvm_options``), for the JVMs of tests that request no server. Not in
    the process that runs the lanes' workers: they inherit its environment, and choose for themselves."""
    if _OWN_JVM_OPTIONS and not lanes.runs_lanes(config):
        from tests.support.class_archive import JIT

        os.environ["SPARK_SUBMIT_OPTS"] = JIT


def pytest_report_header(config):
    """The fault matrix's size and seed, to run a bounded run's cases again (``PURGER_FAULT_SEED``)."""
    from tests.support.faults import FAULTS

    return f"faults: {'full' if FAULTS.full else 'bounded'}, PURGER_FAULT_SEED={FAULTS.seed}"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark ``integration`` every test whose fixture closure reaches a server or a JVM, so that none can
    forget the marker and ``-m "not integration"`` never starts one. In lanes, each lane's tests in order."""
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)
    if lanes.active(config):
        lanes.order(items)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist, no lanes
def pytest_xdist_make_scheduler(config, log):
    if lanes.runs_lanes(config):
        return lanes.LaneScheduling(config, log)


def pytest_collection_finish(session):
    if lanes.active(session.config):
        lanes.collected(session.items)


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures: a session's first reaches the servers
def pytest_runtest_setup(item):
    if lanes.active(item.config):
        lanes.before(item)


@pytest.hookimpl(trylast=True)  # after the test's fixtures are torn down
def pytest_runtest_teardown(item, nextitem):
    if lanes.active(item.config):
        lanes.after(item, nextitem)


_CONTROLLER_RESOURCES = pytest.StashKey[ExitStack]()
# Set by the process that runs the lanes for its workers: the local stack stops at the run's end.
_STOPPED_AT_END_VARIABLE = "PURGER_TESTS_STACK_STOPPED_AT_END"


@pytest.hookimpl(tryfirst=True)  # before xdist starts the workers, which inherit the environment set here
def pytest_sessionstart(session):
    """In lanes, the servers and the class archive once, before the workers start: not raced by two."""
    config = session.config
    if not lanes.runs_lanes(config):
        return
    resources = config.stash[_CONTROLLER_RESOURCES] = ExitStack()
    folder = tempfile.mkdtemp(prefix="purger-lanes-")
    resources.callback(shutil.rmtree, folder, ignore_errors=True)
    os.environ[lanes.FOLDER_VARIABLE] = folder
    if _OWN_JVM_OPTIONS:
        from tests.support.class_archive import java_options

        java_options()
    how, stopped_at_end = resources.enter_context(provided_servers())
    if how == "local" and stopped_at_end:
        os.environ[_STOPPED_AT_END_VARIABLE] = "1"


def pytest_sessionfinish(session):
    if lanes.active(session.config):
        lanes.ended()
    elif (resources := session.config.stash.get(_CONTROLLER_RESOURCES, None)) is not None:
        resources.close()


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


_STACK_STOPPED_AT_END = pytest.StashKey[bool]()


@contextmanager
def provided_servers() -> Iterator[tuple[str, bool]]:
    """Make sure Kafka, Cassandra and S3 answer (the module docstring); yield how they were provided, and
    whether they stop when this ends."""
    if all(os.environ.get(v) for v in ENDPOINT_VARIABLES):
        yield "environment", False
    elif _docker_answers():
        from testcontainers.compose import DockerCompose

        with DockerCompose(str(ROOT), wait=True):
            os.environ.update(
                PURGER_KAFKA_BOOTSTRAP="127.0.0.1:9092",
                PURGER_CASSANDRA_HOSTS="127.0.0.1:9042",
                PURGER_S3_ENDPOINT="http://127.0.0.1:9000",
            )
            yield "docker", True
    else:
        stack = LocalStack()
        started_here = not stack.running()
        stack.up()
        yield "local", started_here
        if started_here:
            stack.down()


@pytest.fixture(scope="session")
def servers(request, spark_jvm_options):
    """Make sure Kafka, Cassandra and S3 answer; yield how they were provided."""
    with provided_servers() as (how, stopped_at_end):
        request.config.stash[_STACK_STOPPED_AT_END] = (
            how == "local" and (stopped_at_end or os.environ.get(_STOPPED_AT_END_VARIABLE) == "1"))
        yield how


@pytest.fixture(scope="session")
def stack_stopped_at_end(servers, request) -> bool:
    """Whether the session stops the local stack at its end (it started it): a server added for some tests then
    needs no tidying after them."""
    return request.config.stash.get(_STACK_STOPPED_AT_END, False)


@pytest.fixture(scope="session")
def run_id() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def dc2_proxy(servers):
    """The path to data centre 2's object store, which a test can cut to make that store fail."""
    endpoint = os.environ.get("PURGER_S3_ENDPOINT", "http://127.0.0.1:9000")
    host, port = urlsplit(endpoint).hostname, urlsplit(endpoint).port or 80
    return TcpProxy(host, port).start()


@pytest.fixture(scope="session")
def config(servers, dc2_proxy, run_id, tmp_path_factory) -> PurgerConfig:
    """Short periods, and topics of this test session's own, so earlier runs' events do not interfere."""
    ledger = tmp_path_factory.mktemp("ledger")
    config = build_config(
        {
            "kafka": {
                "topics": [f"test.{run_id}.events"],
                "control_topic": f"test.{run_id}.control",
                "dead_letter_topic": f"test.{run_id}.dead-letter",
                "reconcile_topic": f"test.{run_id}.reconcile",
            },
            "policies": {"mailbox": {"expired_ttl": "6s", "incomplete_ttl": "8s", "deleted_ttl": "1s",
                                     "payload_grace": "3s"}},
            "stream": {
                "checkpoint": str(tmp_path_factory.mktemp("checkpoint")),
                "trigger_interval": "1s",
                "watermark_delay": "2s",
                "clock_interval": "1s",
                # A tick a second while events are read or a known timer is due; otherwise one every 10 s: an
                # idle batch is about a core-second, and a purger of a module idles beside its other work.
                "quiet_clock_interval": "10s",
                "retry_interval": "2s",
                "retry_cap": "10s",
                "shuffle_partitions": 2,
            },
            "ledger": {"path": str(ledger / "records"), "report_path": str(ledger / "daily_report"),
                       "reconcile_path": str(ledger / "reconcile_report")},
            "metrics": {"port": 0},
            # The keyspace is every test's: a test reconciles a keyspace of its own (tests/reconcile/test_run.py).
            # Its tables hold tens of rows: one scan task a core, not the default 16 (each a Python task and a
            # Cassandra session), is plenty; a reconcile in a warm session took 10.3 s with one, 13.1 s with two
            # (docs/development.md). The release before refuses the key: test_upgrades leaves it out.
            "reconcile": {"interval": "0", "overdue_after": "2s", "orphan_grace": "2s", "orphan_grace_check": False,
                          "max_rows_per_second": 100_000, "tasks_per_core": 1},
        }
    )
    # Data centre 2 through the proxy; environment overrides above have set every endpoint alike.
    stores = dict(config.stores)
    stores["dc2"] = stores["dc2"].model_copy(update={"endpoint": f"http://127.0.0.1:{dc2_proxy.port}"})
    config = config.model_copy(update={"stores": stores})
    prepare(config, partitions=2)
    return config


@pytest.fixture(scope="session")
def spark(spark_jvm_options):
    """One SparkSession for every test. It needs no server, so parsing tests run without the stack; but it is a
    JVM, so its tests are integration tests (``INTEGRATION_FIXTURES``)."""
    from purger.spark import spark_session

    short_lived = os.environ["SPARK_SUBMIT_OPTS"]
    if _OWN_JVM_OPTIONS:
        # This JVM lives as long as the session, and its purgers' batches run back to back: both compilers, whose
        # steady state ran an idle batch in 632 ms against 1,046 ms with C1 alone (bench.idle at 1 s).
        from tests.support.class_archive import java_options

        os.environ["SPARK_SUBMIT_OPTS"] = java_options(short_lived=False)
    try:
        session = spark_session(build_config({"stream": {"shuffle_partitions": 2}}).stream, app_name="purger-tests")
    finally:
        os.environ["SPARK_SUBMIT_OPTS"] = short_lived
    yield session
    session.stop()


@pytest.fixture(scope="session")
def platform(config):
    from simulation.mailbox import Platform

    platform = Platform(config)
    yield platform
    platform.close()

