"""The writer contract's quorum arithmetic (``purger.core.writer_contract``) against a brute-force model that
enumerates every replica set a write may reach and a check may consult; the table of docs/policies.md row by
row; and the lines `purger setup` prints from it. Plain Python, no servers."""

from __future__ import annotations

import re
from itertools import combinations, product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purger.core.writer_contract import (
    PLAIN_LEVELS, SERIAL_LEVELS, Replication, majority, meets, reach, replication_from_schema, seen,
    seen_from_every_data_centre)
from purger.setup import replication_lines
from tests.support import ROOT

NTS = "NetworkTopologyStrategy"
ALWAYS_SEEN_BY_SERIAL = ("QUORUM", "EACH_QUORUM", "ALL", "SERIAL")


def uniform(per_dc: int, data_centres: int) -> Replication:
    return Replication(NTS, {f"dc{i + 1}": per_dc for i in range(data_centres)})


# --- the model: replica sets, enumerated ---------------------------------------------------------


def replica_sets(level: str, replicas: dict[str, int], dc: str) -> list[int]:
    """Every set of replicas (a bit mask) that ``level`` through data centre ``dc`` may have waited for, from
    the levels' definitions: ANY none (a hint); ONE, TWO, THREE that many anywhere; QUORUM and a SERIAL round
    more than half of all; LOCAL_ONE one, LOCAL_QUORUM and a LOCAL_SERIAL round more than half, of ``dc``'s;
    EACH_QUORUM more than half of each data centre's; ALL every one. Empty when the keyspace has too few."""
    bits, start = {}, 0
    for name, count in replicas.items():
        bits[name] = list(range(start, start + count))
        start += count
    everyone = [bit for each in bits.values() for bit in each]

    def more_than_half(pool: list[int]) -> int:
        return next(k for k in range(len(pool) + 1) if 2 * k > len(pool))

    def any_of(pool: list[int], count: int) -> list[int]:
        return [sum(1 << bit for bit in chosen) for chosen in combinations(pool, count)]

    own = bits.get(dc, [])
    if level in ("ANY", "ONE", "TWO", "THREE"):
        return any_of(everyone, ("ANY", "ONE", "TWO", "THREE").index(level))
    if level in ("QUORUM", "SERIAL"):
        return any_of(everyone, more_than_half(everyone))
    if level == "ALL":
        return any_of(everyone, len(everyone))
    if level == "LOCAL_ONE":
        return any_of(own, 1) if own else []
    if level in ("LOCAL_QUORUM", "LOCAL_SERIAL"):
        return any_of(own, more_than_half(own)) if own else []
    assert level == "EACH_QUORUM"
    per_dc = [any_of(pool, more_than_half(pool)) for pool in bits.values()]
    return [sum(chosen) for chosen in product(*per_dc)]


def always_meet(write: list[int], read: list[int]) -> bool:
    return all(w & r for w in write for r in read)


replications = st.dictionaries(st.sampled_from(["dc1", "dc2", "dc3"]), st.integers(1, 5), min_size=1).filter(
    lambda replicas: sum(replicas.values()) <= 10)


@settings(max_examples=400, deadline=None)
@given(replicas=replications, write=st.sampled_from(PLAIN_LEVELS + SERIAL_LEVELS),
       read=st.sampled_from(PLAIN_LEVELS[1:] + SERIAL_LEVELS), data=st.data())
def test_seen_is_what_every_replica_set_says(replicas, write, read, data):
    """Seen exactly when every write set meets every read set; refused exactly when a level has no replica set
    (too few replicas) or pairs a conditional write with a plain read."""
    centres = [*replicas, "dc9"]  # dc9 holds no replica
    writer_dc, reader_dc = data.draw(st.sampled_from(centres)), data.draw(st.sampled_from(centres))
    replication = Replication(NTS, replicas)
    writes, reads = replica_sets(write, replicas, writer_dc), replica_sets(read, replicas, reader_dc)
    if (write in SERIAL_LEVELS and read not in SERIAL_LEVELS) or not writes or not reads:
        with pytest.raises(ValueError):
            seen(write, read, replication, writer_dc, reader_dc)
    else:
        assert seen(write, read, replication, writer_dc, reader_dc) == always_meet(writes, reads)


@settings(max_examples=200, deadline=None)
@given(replicas=replications, first=st.sampled_from(PLAIN_LEVELS + SERIAL_LEVELS),
       second=st.sampled_from(PLAIN_LEVELS + SERIAL_LEVELS), data=st.data())
def test_meeting_is_symmetric(replicas, first, second, data):
    """When the purger's round meets a writer's, the writer's meets the purger's."""
    one, other = data.draw(st.sampled_from(list(replicas))), data.draw(st.sampled_from(list(replicas)))
    replication = Replication(NTS, replicas)
    try:
        reaches = reach(first, replication, one), reach(second, replication, other)
    except ValueError:  # too few replicas for one of them
        return
    assert meets(*reaches, replication) == meets(*reversed(reaches), replication)


# --- the table of docs/policies.md ---------------------------------------------------------------

# (replicas per data centre, data centres): whether LOCAL_QUORUM and ONE are seen by a SERIAL check.
TABLE = {
    (1, 1): (True, True), (1, 2): (True, True), (1, 3): (False, False),
    (2, 1): (True, True), (2, 2): (True, False), (2, 3): (False, False),
    (3, 1): (True, False), (3, 2): (False, False), (3, 3): (False, False),
    (5, 1): (True, False), (5, 2): (False, False), (5, 3): (False, False),
}


@pytest.mark.parametrize(("per_dc", "data_centres"), TABLE)
def test_local_quorum_against_serial_row_by_row(per_dc, data_centres):
    replication = uniform(per_dc, data_centres)
    local_quorum, one = TABLE[per_dc, data_centres]
    total, check = per_dc * data_centres, majority(per_dc * data_centres)
    assert reach("SERIAL", replication, "dc1").anywhere == check == total // 2 + 1
    assert reach("LOCAL_QUORUM", replication, "dc1").in_each == {"dc1": per_dc // 2 + 1}
    assert seen_from_every_data_centre("LOCAL_QUORUM", "SERIAL", replication, "dc1") == local_quorum
    assert (per_dc // 2 + 1 + check > total) == local_quorum
    assert seen_from_every_data_centre("ONE", "SERIAL", replication, "dc1") == one
    assert seen_from_every_data_centre("LOCAL_ONE", "SERIAL", replication, "dc1") == one
    for level in ALWAYS_SEEN_BY_SERIAL:
        assert seen_from_every_data_centre(level, "SERIAL", replication, "dc1"), level


def test_the_examples_of_the_brief_and_the_docs():
    # One replica in each of two data centres: W = 1, N = 2, Q = 2, and 1 + 2 > 2.
    assert seen("LOCAL_QUORUM", "SERIAL", uniform(1, 2), "dc2", "dc1")
    # Three in each of two: W = 2, N = 6, Q = 4, and 2 + 4 = 6 is not > 6.
    assert not seen("LOCAL_QUORUM", "SERIAL", uniform(3, 2), "dc2", "dc1")
    # Uneven: dc1=3 dc2=1, N = 4, Q = 3: through dc1 2 + 3 > 4, through dc2 1 + 3 = 4.
    uneven = Replication(NTS, {"dc1": 3, "dc2": 1})
    assert seen("LOCAL_QUORUM", "SERIAL", uneven, "dc1", "dc2")
    assert not seen("LOCAL_QUORUM", "SERIAL", uneven, "dc2", "dc1")


@pytest.mark.parametrize(("per_dc", "data_centres"), TABLE)
def test_local_serial_sees_only_its_own_data_centre_and_each_quorum(per_dc, data_centres):
    replication = uniform(per_dc, data_centres)
    assert seen("LOCAL_QUORUM", "LOCAL_SERIAL", replication, "dc1", "dc1")
    assert seen("LOCAL_SERIAL", "LOCAL_SERIAL", replication, "dc1", "dc1")
    assert seen_from_every_data_centre("EACH_QUORUM", "LOCAL_SERIAL", replication, "dc1")
    if data_centres > 1:
        assert not seen("LOCAL_QUORUM", "LOCAL_SERIAL", replication, "dc2", "dc1")
        assert not seen("LOCAL_SERIAL", "LOCAL_SERIAL", replication, "dc2", "dc1")
        # A majority of all must spill into the purger's majority: two data centres of 1 or 2 replicas.
        expected = data_centres == 2 and per_dc <= 2
        assert seen("QUORUM", "LOCAL_SERIAL", replication, "dc2", "dc1") == expected
        assert seen("SERIAL", "LOCAL_SERIAL", replication, "dc2", "dc1") == expected


def test_the_docs_table_is_the_arithmetic():
    """Each row of the table in docs/policies.md, "The writer contract across data centres": its numbers and
    its yes and no."""
    text = (ROOT / "docs" / "policies.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([^|]+) \| ([^|]+) \|$", text, re.MULTILINE)
    assert {(int(r[0]), int(r[1])) for r in rows} == set(TABLE)
    for per_dc, data_centres, total, check, write, local_quorum, one in rows:
        per_dc, data_centres = int(per_dc), int(data_centres)
        replication = uniform(per_dc, data_centres)
        assert int(total) == replication.total and int(check) == majority(replication.total)
        assert int(write) == majority(per_dc)
        assert local_quorum.endswith("yes" if TABLE[per_dc, data_centres][0] else "no")
        assert one.endswith("yes" if TABLE[per_dc, data_centres][1] else "no")
        assert local_quorum.startswith(f"{write} + {check} = {int(write) + int(check)}")


# --- refusals and the schema's replication -------------------------------------------------------


def test_a_conditional_write_against_a_plain_read_is_refused():
    with pytest.raises(ValueError, match="commit's consistency level"):
        seen("SERIAL", "LOCAL_QUORUM", uniform(3, 2), "dc1", "dc1")


def test_a_level_the_keyspace_has_too_few_replicas_for_is_refused():
    with pytest.raises(ValueError, match="needs more replicas than keyspace replication NetworkTopologyStrategy dc1=3"):
        reach("LOCAL_QUORUM", uniform(3, 1), "dc2")
    with pytest.raises(ValueError, match="THREE through data centre dc1"):
        reach("THREE", uniform(2, 1), "dc1")


def test_replication_from_the_schema_table():
    assert replication_from_schema({"class": "org.apache.cassandra.locator.NetworkTopologyStrategy", "dc1": "3",
                                    "dc2": "3/1", "dc3": "0"}, "dc1") == Replication(NTS, {"dc1": 3, "dc2": 3})
    simple = replication_from_schema({"class": "org.apache.cassandra.locator.SimpleStrategy",
                                      "replication_factor": "2"}, "dc7")
    assert simple == Replication("SimpleStrategy", {"dc7": 2})
    assert str(simple) == "SimpleStrategy replication_factor=2"
    assert str(uniform(3, 2)) == "NetworkTopologyStrategy dc1=3 dc2=3"


# --- what `purger setup` prints ------------------------------------------------------------------

DOC = "(docs/policies.md, the writer contract across data centres)"


def test_setup_says_local_quorum_is_not_enough_with_three_replicas_in_two_data_centres():
    lines = replication_lines("mailbox", uniform(3, 2), "SERIAL", "LOCAL_QUORUM", "dc1", "payload_refs")
    assert lines == [
        "keyspace mailbox: NetworkTopologyStrategy dc1=3 dc2=3; a platform write at LOCAL_QUORUM (2 of 6, in dc2) is "
        "not sure to be seen by the purger's SERIAL checks (any 4 of 6): revivals, payload links and users added "
        "again must be lightweight transactions at SERIAL " + DOC,
        "payload references (payload_refs) are read at LOCAL_QUORUM (2 of 6, in dc1): one written at LOCAL_QUORUM "
        "(2 of 6, in dc2) is not sure to be seen; write them at EACH_QUORUM or ALL " + DOC]
    # The docs show the same lines.
    assert "\n".join(lines) in (ROOT / "docs" / "policies.md").read_text()


def test_setup_says_local_quorum_is_enough_in_one_data_centre():
    assert replication_lines("mailbox", uniform(3, 1), "SERIAL", "LOCAL_QUORUM", "dc1", "payload_refs") == [
        "keyspace mailbox: NetworkTopologyStrategy dc1=3; a platform write at LOCAL_QUORUM (2 of 3, in dc1) is seen by "
        "the purger's SERIAL checks (any 2 of 3): revivals, payload links and users added again must be lightweight "
        "transactions at SERIAL or LOCAL_SERIAL " + DOC]


def test_setup_with_local_serial_across_data_centres_names_the_purgers_own():
    lines = replication_lines("mailbox", uniform(3, 2), "LOCAL_SERIAL", "LOCAL_QUORUM", "dc1", None)
    assert lines == [
        "keyspace mailbox: NetworkTopologyStrategy dc1=3 dc2=3; a platform write at LOCAL_QUORUM (2 of 6, in dc2) is "
        "not sure to be seen by the purger's LOCAL_SERIAL checks (2 of 6, in dc1): revivals, payload links and users "
        "added again must run their lightweight transactions through dc1 " + DOC]


def test_setup_names_a_replication_class_it_cannot_reason_about():
    assert replication_lines("mailbox", Replication("EverywhereStrategy", {}), "SERIAL", "LOCAL_QUORUM", "dc1",
                             None) == [
        "keyspace mailbox: replication class EverywhereStrategy, whose placement the purger does not know: use "
        "NetworkTopologyStrategy to know which platform writes its checks are sure to see " + DOC]


def test_setup_names_a_local_data_centre_without_replicas_as_a_problem():
    """The purger's LOCAL_QUORUM reads through a data centre the keyspace does not replicate to would fail: one
    problem line (a single-node stack cannot make such a keyspace, so this is tested off the servers)."""
    from purger.core.settings import PurgerConfig
    from purger.setup import Findings, _replication

    findings = Findings()
    options = {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy", "dc1": "3", "dc2": "3"}
    _replication(PurgerConfig(), "mailbox", options, "dc3", "Cassandra 10.0.0.5:9042", findings)
    assert findings.problems == [
        "Cassandra 10.0.0.5:9042: keyspace mailbox (NetworkTopologyStrategy dc1=3 dc2=3) has no replica in data "
        "centre dc3, where the purger reads at LOCAL_QUORUM; replicate the keyspace there, or set "
        "cassandra.local_data_centre to one of dc1, dc2"]
    assert findings.replication == []
