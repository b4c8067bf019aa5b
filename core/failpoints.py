"""Failpoints: named moments where the fault tests kill the purger or make a writer land (RELIABILITY.md).

Not part of the policy interface: the engine names its moments itself (``before_<kind>_claim``,
``after_<kind>_dependent_delete``, ``after_<kind>_delete``, ``before_ledger_write``, ...).

Example::

    failpoint("before_ledger_write")   # does nothing unless PURGER_FAILPOINT names it or a test injects one
    with injected(lambda name: ...):   # in-process tests: called at every failpoint
        ...
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

_injected: list[Callable[[str], None]] = []


def failpoint(name: str) -> None:
    """Fault injection for the kill tests (tests/test_faults.py): with ``PURGER_FAILPOINT=<name>`` the
    first process to reach ``name`` kills the purger's whole process group (kill -9), once per
    ``PURGER_FAILPOINT_MARKER`` file. Without the variable it does nothing."""
    for action in list(_injected):
        action(name)
    if os.environ.get("PURGER_FAILPOINT") != name:
        return
    try:
        Path(os.environ["PURGER_FAILPOINT_MARKER"]).open("x").close()
    except FileExistsError:
        return
    # The session's group: the driver and its JVM (PySpark's worker daemon has a group of its own).
    os.killpg(os.getsid(0), signal.SIGKILL)


@contextmanager
def injected(action: Callable[[str], None]) -> Iterator[None]:
    """Call ``action(name)`` at every failpoint reached in this process while the block runs (a test's
    crash, or a writer landing at a chosen moment)."""
    _injected.append(action)
    try:
        yield
    finally:
        _injected.remove(action)
