"""The purger's own SparkSession forks its Python workers from ``purger.worker_daemon``, libraries imported."""

import gc
import os
import sys
import zipimport

import pytest

from purger.worker_daemon import PRELOADED

pytestmark = pytest.mark.integration  # Spark (a JVM), though no server


def test_python_workers_are_forked_from_the_purgers_daemon_with_its_libraries_imported(spark):
    preloaded = PRELOADED  # a local, so the task carries the names and imports nothing of the purger

    def seen_by_a_worker(_: int) -> tuple[str, list[str], list[str], int, bool]:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as parent:
            daemon = parent.read().replace(b"\0", b" ").decode()
        # Archives a task's start would read again (its importlib.invalidate_caches()).
        archives = sorted({importer.archive for importer in sys.path_importer_cache.values()
                           if isinstance(importer, zipimport.zipimporter)})
        return (daemon, sorted(name for name in preloaded if name in sys.modules), archives, gc.get_freeze_count(),
                gc.isenabled())

    seen = spark.sparkContext.parallelize(range(2), 2).map(seen_by_a_worker).collect()
    for daemon, loaded, archives, frozen, collecting in seen:
        assert "-m purger.worker_daemon" in daemon
        assert loaded == sorted(PRELOADED)
        assert archives == []  # PySpark and Py4J imported from their installed packages, not Spark's zips
        # The libraries' objects are out of the collection a reused worker runs after each task; a task's are not.
        assert frozen > 50_000 and collecting
