"""Run by every Python process started with this folder on its ``PYTHONPATH`` (``site`` imports
``sitecustomize``): the Python workers of a submitted purger in ``tests/integration/test_cluster.py``, its
executors' alone (below). The purger is then imported only from a zip on ``sys.path`` (the ``--py-files`` zip Spark puts there),
never from the purger installed in this Python, as on a cluster whose executors have only the zip. Each such
import's file is appended to ``PURGER_ZIP_ONLY_MARKER``, so the test sees that it happened and where from."""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec, PathFinder


class ZipOnly:
    """Finds ``purger`` in the zips on ``sys.path`` alone; its modules then come from the package found."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name != "purger":
            return None
        spec = PathFinder.find_spec(name, [entry for entry in sys.path if entry.endswith(".zip")])
        if spec is None:
            raise ModuleNotFoundError("purger: in no zip on sys.path (the installed one is hidden)", name=name)
        with open(os.environ["PURGER_ZIP_ONLY_MARKER"], "a") as marker:
            marker.write(f"{spec.origin}\n")
        return spec


# Executors only (a standalone worker gives their processes SPARK_EXECUTOR_DIRS): the Python that the driver's JVM
# starts for the stateful stage's set-up gets the same environment, and the driver has the purger installed.
if "SPARK_EXECUTOR_DIRS" in os.environ:
    sys.meta_path.insert(0, ZipOnly())
