"""Test scaffolding, as ``pyspark.testing`` and ``delta.testing`` keep theirs: hooks at the product's failpoints
(``purger.core.failpoints``), for the fault tests here and for a policy author's own.

In a test's own process, ``injected`` calls a hook at every failpoint while a block runs (a test's crash, or a
writer landing at a chosen moment). In the processes of a purger a test starts (its driver, Spark's Python
workers), ``install_from_environment`` kills the purger at the failpoint ``PURGER_FAILPOINT`` names; the fault
tests run it at each such process's start by putting ``tests/support/failpoint_site`` on its ``PYTHONPATH``
(a ``sitecustomize``), so that nothing of it is in the product's own start.

Example::

    with injected(lambda name: name == "before_ledger_write" and stop()):
        ...
    install_from_environment()   # PURGER_FAILPOINT=after_message_delete PURGER_FAILPOINT_MARKER=/tmp/fired
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from purger.core.failpoints import install, uninstall

__all__ = ["injected", "install_from_environment", "kill_at"]


@contextmanager
def injected(action: Callable[[str], None]) -> Iterator[None]:
    """Call ``action(name)`` at every failpoint reached in this process while the block runs."""
    install(action)
    try:
        yield
    finally:
        uninstall(action)


def kill_at(point: str, marker: Path) -> Callable[[str], None]:
    """A hook that kills the purger (kill -9) the first time any of its processes reaches ``point``: once per
    ``marker`` file, which the first process to get there creates."""

    def kill(reached: str) -> None:
        if reached != point:
            return
        try:
            marker.open("x").close()
        except FileExistsError:
            return
        # The session's group: the driver and its JVM (PySpark's worker daemon has a group of its own).
        os.killpg(os.getsid(0), signal.SIGKILL)

    return kill


def install_from_environment() -> None:
    """With ``PURGER_FAILPOINT=<name>`` and ``PURGER_FAILPOINT_MARKER=<file>``, ``kill_at`` that failpoint in this
    process; without them, nothing."""
    point = os.environ.get("PURGER_FAILPOINT")
    if point:
        install(kill_at(point, Path(os.environ["PURGER_FAILPOINT_MARKER"])))
