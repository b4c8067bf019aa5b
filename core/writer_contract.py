"""Which of the platform's writes the purger's checks are sure to see, from the keyspace's replication:
quorum arithmetic (docs/policies.md, "The writer contract across data centres").

A write is acknowledged by some replicas; a read, or the check of a conditional statement, consults some
replicas. The read is sure to see the write when every set of replicas the write may reach meets every
set the read may consult. A consistency level reaches either *any* ``n`` replicas of the keyspace (ONE,
TWO, THREE, QUORUM, ALL, and a Paxos round at SERIAL) or a fixed number *in each* of some data centres
(LOCAL_ONE, LOCAL_QUORUM and a Paxos round at LOCAL_SERIAL in the coordinator's own, EACH_QUORUM in every
one). With ``N`` replicas in all and ``r[dc]`` in each data centre, a write and a read always meet when:

- both reach any replicas (``w`` and ``q`` of them): ``w + q > N``;
- one reaches ``a[dc]`` in each data centre, the other any ``q``: ``q > N - sum(a)``;
- both reach some in each data centre: ``a[dc] + b[dc] > r[dc]`` in at least one.

Otherwise some write set and some read set are disjoint, and a read may miss an acknowledged write. A
majority of ``n`` replicas is ``n // 2 + 1``: QUORUM and SERIAL take a majority of all ``N``, LOCAL_QUORUM
and LOCAL_SERIAL a majority of the coordinator's data centre.

The purger's conditional deletes and claims are Paxos rounds at ``cassandra.serial_consistency`` that
read the row at QUORUM (SERIAL) or LOCAL_QUORUM (LOCAL_SERIAL). A conditional write of the platform's
(a lightweight transaction) is written as ``SERIAL`` or ``LOCAL_SERIAL``, its own serial consistency, and
counts by the majority that accepted it, which every later Paxos round meeting it consults; a plain read
sees it only through its commit's consistency level, so that pair is refused. Meeting is symmetric: when
the purger's round sees a writer's, the writer's sees the purger's.

Example::

    from purger.core.writer_contract import Replication, reach, seen
    two_by_three = Replication("NetworkTopologyStrategy", {"dc1": 3, "dc2": 3})
    seen("LOCAL_QUORUM", "SERIAL", two_by_three, writer_dc="dc2", reader_dc="dc1")   # False: 2 + 4 = 6, not > 6
    seen("EACH_QUORUM", "SERIAL", two_by_three, writer_dc="dc2", reader_dc="dc1")    # True: 4 > 6 - 4
    seen("SERIAL", "SERIAL", two_by_three, writer_dc="dc2", reader_dc="dc1")         # True: a lightweight transaction
    reach("LOCAL_QUORUM", two_by_three, "dc2")          # Reach(anywhere=None, in_each={'dc2': 2})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

# The consistency levels of plain reads and writes (ANY only writes), and the serial ones: for a read, the
# purger's Paxos round (a conditional delete or claim, or a serial read); for a write, a conditional write.
PLAIN_LEVELS = ("ANY", "ONE", "TWO", "THREE", "LOCAL_ONE", "LOCAL_QUORUM", "QUORUM", "EACH_QUORUM", "ALL")
SERIAL_LEVELS = ("SERIAL", "LOCAL_SERIAL")

# The strategies whose placement is known: NetworkTopologyStrategy per data centre, SimpleStrategy on the ring.
KNOWN_STRATEGIES = ("NetworkTopologyStrategy", "SimpleStrategy")


def majority(replicas: int) -> int:
    """A quorum of ``replicas``: more than half of them."""
    return replicas // 2 + 1


@dataclass(frozen=True)
class Replication:
    """A keyspace's replication: its strategy's short name and the replicas in each data centre (zeros left
    out). SimpleStrategy places replicas without regard to data centres; it is read as one data centre."""

    strategy: str
    replicas: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.replicas.values())

    def __str__(self) -> str:
        if self.strategy == "SimpleStrategy":
            return f"SimpleStrategy replication_factor={self.total}"
        return " ".join([self.strategy, *(f"{dc}={n}" for dc, n in sorted(self.replicas.items()))])


def replication_from_schema(options: Mapping[str, str], local_dc: str) -> Replication:
    """A keyspace's ``replication`` column of ``system_schema.keyspaces`` as a ``Replication``; a
    SimpleStrategy's replicas counted in ``local_dc``, and a transient factor (``"3/1"``) by all its
    replicas, as Cassandra counts its quorums.

    Example::

        replication_from_schema({"class": "org.apache.cassandra.locator.NetworkTopologyStrategy", "dc1": "3"}, "dc1")
        # Replication(strategy='NetworkTopologyStrategy', replicas={'dc1': 3})
    """
    strategy = options["class"].rsplit(".", 1)[-1]
    if strategy == "SimpleStrategy":
        factors = {local_dc: options["replication_factor"]}
    else:
        factors = {dc: value for dc, value in options.items() if dc != "class"}
    replicas = {dc: int(value.split("/")[0]) for dc, value in factors.items()}
    return Replication(strategy, {dc: n for dc, n in replicas.items() if n > 0})


@dataclass(frozen=True)
class Reach:
    """The replicas a consistency level waits for: any ``anywhere`` of the keyspace's, or ``in_each[dc]``
    in each data centre named (one form or the other)."""

    anywhere: int | None = None
    in_each: Mapping[str, int] = field(default_factory=dict)


def reach(level: str, replication: Replication, dc: str) -> Reach:
    """The replicas ``level`` waits for when its coordinator is in data centre ``dc``; ``ValueError`` when
    the keyspace has too few replicas for it (Cassandra answers such a request Unavailable)."""
    replicas, total = replication.replicas, replication.total
    local = replicas.get(dc, 0)
    anywhere = {"ANY": 0, "ONE": 1, "TWO": 2, "THREE": 3, "QUORUM": majority(total), "SERIAL": majority(total),
                "ALL": total}
    in_own = {"LOCAL_ONE": 1, "LOCAL_QUORUM": majority(local), "LOCAL_SERIAL": majority(local)}
    if level in anywhere:
        found = Reach(anywhere=anywhere[level])
        short = found.anywhere > total
    elif level in in_own:
        found = Reach(in_each={dc: in_own[level]})
        short = local == 0
    elif level == "EACH_QUORUM":
        found = Reach(in_each={each: majority(n) for each, n in replicas.items()})
        short = False  # a majority of every data centre that has replicas
    else:
        raise ValueError(f"consistency level {level} is not one of {', '.join(PLAIN_LEVELS + SERIAL_LEVELS)}")
    if short:
        raise ValueError(f"{level} through data centre {dc} needs more replicas than keyspace replication "
                         f"{replication} has there")
    return found


def meets(write: Reach, read: Reach, replication: Replication) -> bool:
    """Whether every replica set ``write`` may reach shares a replica with every set ``read`` may consult."""
    total = replication.total
    if write.anywhere is not None and read.anywhere is not None:
        return write.anywhere + read.anywhere > total
    if write.anywhere is not None or read.anywhere is not None:
        fixed, anywhere = (read, write.anywhere) if write.anywhere is not None else (write, read.anywhere)
        return anywhere > total - sum(fixed.in_each.values())
    return any(write.in_each[dc] + read.in_each[dc] > replication.replicas[dc]
               for dc in write.in_each.keys() & read.in_each.keys())


def seen(write: str, read: str, replication: Replication, writer_dc: str, reader_dc: str) -> bool:
    """Whether a write at ``write`` through data centre ``writer_dc``, once acknowledged, is always seen by
    a read at ``read`` through ``reader_dc``. ``write`` SERIAL or LOCAL_SERIAL is a conditional write at
    that serial consistency, ``read`` SERIAL or LOCAL_SERIAL a Paxos round (a conditional statement's check,
    or a serial read)."""
    if write in SERIAL_LEVELS and read not in SERIAL_LEVELS:
        raise ValueError(f"a conditional write at {write} is seen by a plain read at {read} through its commit's "
                         "consistency level: ask about that level instead")
    if read == "ANY":
        raise ValueError("ANY is a consistency level for writes only")
    return meets(reach(write, replication, writer_dc), reach(read, replication, reader_dc), replication)


def seen_from_every_data_centre(write: str, read: str, replication: Replication, reader_dc: str) -> bool:
    """``seen`` for a writer in any data centre that holds replicas."""
    return all(seen(write, read, replication, dc, reader_dc) for dc in replication.replicas)
