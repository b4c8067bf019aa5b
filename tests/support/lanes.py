"""The suite in two lanes: two pytest-xdist workers (``make test``: ``pytest -n 2 --dist loadgroup``), each a
test session of its own (its SparkSession, its topics, checkpoint and ledger), on the same servers.

A lane alone left most of two cores idle: the tests wait for deadlines, restarts and JVM starts, and a whole
fresh-clone run used 1.24 of 2 cores (docs/development.md, "Where the suite's time goes"). Two lanes fill
that. Which tests go where is fixed here, by module, balanced on a CI run's times, so that a run is the same
on every machine:

- lane ``beside`` runs ``BESIDE``'s modules; lane ``main`` the rest, its plain Python tests first;
- a test that stops a shared server (``FIRST``: Cassandra down, the Kafka broker restarted) runs first in
  ``beside``, while ``main`` runs its plain Python tests, which reach no server; ``main``'s first test that
  reaches a server waits for it to end;
- a test that reshapes a shared server (``LAST``: a second Cassandra node joined to the ring, then
  decommissioned) runs last in ``beside``, after the tests it would disturb, which run in ``beside`` too
  (``RING_BOUND``: a keyspace of one replica by ``SimpleStrategy`` loses writes to the ranges node 2 takes).
  Lane ``main``'s tests go on beside it: their keyspaces are replicated in data centre 1 and their sessions
  route there.

The lanes meet through a file in a folder of the run's own (``_first_done``), which the process that runs the
workers makes before they start and removes at the end. Without ``--dist loadgroup`` (a plain ``pytest``,
``make faults``) nothing here applies: the suite runs in one process, in its order.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

MAIN, BESIDE_LANE = "main", "beside"

# Modules of lane beside (paths from the repository's root), besides FIRST and LAST: about half the suite's
# time (docs/development.md, "Where the suite's time goes").
RING_BOUND = frozenset({"tests/reconcile/test_token_ranges.py", "tests/purger/test_setup.py"})
BESIDE = frozenset({
    "tests/integration/test_cluster.py", "tests/integration/test_operations.py", "tests/integration/test_upgrades.py",
    "tests/integration/test_prometheus_live.py", "tests/reconcile/test_orphans.py",
    "tests/reconcile/test_orphan_rows.py", "tests/reconcile/test_reconcile_replay.py", "tests/sinks/test_ledger_upkeep.py",
    "tests/sinks/test_ledger_paths.py", "tests/streams/test_clock.py", "tests/sinks/test_restorations.py",
}) | RING_BOUND
# Tests (node ids or their prefixes) that stop a shared server: first in lane beside, alone.
FIRST = ("tests/integration/test_faults.py::test_cassandra_down_and_a_kafka_restart_lose_nothing",)
# Tests that reshape a shared server: last in lane beside, after RING_BOUND.
LAST = ("tests/integration/two_nodes/",)

WAIT_S = 1800.0  # lane main waiting longer than this for FIRST: lane beside is stuck, and the test says so


FOLDER_VARIABLE = "PURGER_TESTS_LANES"  # the folder of the run's lane files, for its workers


def runs_lanes(config: pytest.Config) -> bool:
    """Whether this process runs the workers of a run in lanes."""
    return not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") == "loadgroup"


def active(config: pytest.Config) -> bool:
    """Whether this process is a worker of a run in lanes (xdist gives a worker ``loadgroup``, not ``dist``)."""
    return hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False) and FOLDER_VARIABLE in os.environ


def is_first(item: pytest.Item) -> bool:
    return item.nodeid.startswith(FIRST)


def is_last(item: pytest.Item) -> bool:
    return item.nodeid.startswith(LAST)


def lane_of(nodeid: str) -> str:
    return BESIDE_LANE if nodeid.split("::")[0] in BESIDE or nodeid.startswith(FIRST + LAST) else MAIN


def lane(item: pytest.Item) -> str:
    return lane_of(item.nodeid)


def reaches_a_server(item: pytest.Item) -> bool:
    return item.get_closest_marker("integration") is not None


def order(items: list[pytest.Item]) -> None:
    """Each lane's tests in order: ``main``'s plain Python tests first; ``beside``'s ``FIRST`` first and
    ``LAST`` last. Otherwise the collection's order (a module's tests together, for its fixtures)."""

    def rank(item: pytest.Item) -> tuple[int, int]:
        if lane(item) == MAIN:
            return 0, int(reaches_a_server(item))
        return 1, 0 if is_first(item) else 2 if is_last(item) else 1

    items.sort(key=rank)


class LaneScheduling(LoadScopeScheduling):
    """xdist's scheduling by scope, a lane a scope: each worker gets one lane's tests, all at once, in the
    order collected. (Not ``xdist_group`` marks: ``--dist loadgroup`` of xdist 3.8 groups nothing under
    pytest 9.2, pytest-xdist issue 1386.)"""

    def _split_scope(self, nodeid: str) -> str:
        return lane_of(nodeid)


def _first_done() -> Path:
    """The file that says lane beside's ``FIRST`` tests have ended, in the folder the controller made."""
    return Path(os.environ[FOLDER_VARIABLE]) / "first-done"


def _say_first_done() -> None:
    _first_done().touch()


def _wait_for_first() -> None:
    deadline = time.monotonic() + WAIT_S
    while not _first_done().exists():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {WAIT_S:.0f} s for lane beside's tests that stop a shared server "
                        f"({_first_done()}): is that lane stuck?")
        time.sleep(0.5)


def collected(items: list[pytest.Item]) -> None:
    """Nothing to wait for when a run has no ``FIRST`` test (``-k``, a module alone)."""
    if not any(is_first(item) for item in items):
        _say_first_done()


_ran_beside = False  # whether this worker runs lane beside: LaneScheduling gives a worker one lane


def before(item: pytest.Item) -> None:
    """Wait for what must end before ``item`` starts."""
    global _ran_beside
    if lane(item) == BESIDE_LANE:
        _ran_beside = True
        if not is_first(item):  # past FIRST, even when a crash cut it short
            _say_first_done()
    elif reaches_a_server(item):
        _wait_for_first()


def after(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Say what has ended once ``item`` has."""
    if is_first(item) and (nextitem is None or not is_first(nextitem)):
        _say_first_done()


def ended() -> None:
    """Lane beside's session ended, its tests run or not (``-x``, a crash's replacement): lane main waits no
    longer for it."""
    if _ran_beside:
        _say_first_done()
