"""The purger's own SparkSession forks its Python workers from ``purger.worker_daemon``, libraries imported."""

import os
import sys

import pytest

from purger.worker_daemon import PRELOADED

pytestmark = pytest.mark.integration  # Spark (a JVM), though no server


def test_python_workers_are_forked_from_the_purgers_daemon_with_its_libraries_imported(spark):
    preloaded = PRELOADED  # a local, so the task carries the names and imports nothing of the purger

    def seen_by_a_worker(_: int) -> tuple[str, list[str]]:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as parent:
            daemon = parent.read().replace(b"\0", b" ").decode()
        return daemon, sorted(name for name in preloaded if name in sys.modules)

    for daemon, loaded in spark.sparkContext.parallelize(range(2), 2).map(seen_by_a_worker).collect():
        assert "-m purger.worker_daemon" in daemon
        assert loaded == sorted(PRELOADED)
