"""A stand-in for the payment store (docs/policies.md, units_of_work): the writer side of the ``units_of_work`` policy's contract.

A unit of work starts with its ``units_of_work`` row and its objects, spread
over the collections; it may then finish and be archived. Finishing and
archiving follow the writer contract of ``policies.units_of_work``: a
conditional update that a purge's claim refuses, in which case the unit is
treated as gone and no event is emitted. Each change is followed by its event,
keyed by ``unit_of_work_id``. Changes are dated by ``at``, which may be years
in the past.

``NINE_EXAMPLES`` are the cases of the rule at execution date 2023-05-17 with
retention P2Y (lower bound 2021-05-17T00:00Z), standing in for the nine
examples of the payment store's purging documentation: data for the tests and
the demo.

Example::

    from datetime import datetime, timezone
    from purger.core.settings import CassandraConfig, KafkaConfig
    from purger.policies.units_of_work import UnitsOfWorkSettings
    platform = UnitsOfWorkPlatform(KafkaConfig(), CassandraConfig(), "payments.events", "payments",
                                   UnitsOfWorkSettings())
    platform.start("u1", "PAYMENT", at=datetime(2021, 3, 1, tzinfo=timezone.utc), children=5)
    platform.finish("u1", at=datetime(2021, 3, 2, tzinfo=timezone.utc))   # True
    platform.rows("u1")   # ({'journey_type': 'PAYMENT', 'started_at': ..., 'purge_started_at': None, ...}, 5)
    platform.flush()
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Any, NamedTuple

from cassandra import ConsistencyLevel

from purger.connectors import read_serially
from purger.core.settings import CassandraConfig, KafkaConfig
from purger.policies.units_of_work import COLLECTIONS, UOW_ARCHIVED, UOW_FINISHED, UOW_STARTED, UnitsOfWorkSettings
from simulation.events import EventWriter


class Example(NamedTuple):
    name: str
    row: dict[str, Any]  # the row's journey_type, started_at, finished_at and archived_at
    settings: dict[str, Any]  # the policy's settings, beside retention_period P2Y
    purged: bool


EXAMPLES_DATE = date(2023, 5, 17)


def _at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=timezone.utc)


def _row(journey_type: str, started_at: datetime, finished_at: datetime | None = None,
         archived_at: datetime | None = None) -> dict[str, Any]:
    return dict(journey_type=journey_type, started_at=started_at, finished_at=finished_at, archived_at=archived_at)


NINE_EXAMPLES: tuple[Example, ...] = (
    Example("finished just before the lower bound",
            _row("PAYMENT", _at(2021, 5, 10), _at(2021, 5, 16, 23, 59, 59, 999_000)), {}, True),
    Example("finished exactly at the lower bound",
            _row("PAYMENT", _at(2021, 5, 10), _at(2021, 5, 17)), {}, False),
    Example("finished after the lower bound",
            _row("RECALL", _at(2021, 5, 10), _at(2021, 5, 18)), {}, False),
    Example("running, started before the lower bound",
            _row("BULK", _at(2021, 5, 16)), {}, True),
    Example("running, started before the lower bound, terminal only",
            _row("BULK", _at(2021, 5, 16)), {"terminal_only": True}, False),
    Example("running, started after the lower bound",
            _row("BATCH", _at(2021, 5, 18)), {}, False),
    Example("archived-dependent and archived",
            _row("BULK", _at(2021, 2, 1), _at(2021, 3, 1), _at(2021, 4, 1)),
            {"archived_dependent_journey_types": ["BULK"]}, True),
    Example("archived-dependent and not archived",
            _row("BULK", _at(2021, 2, 1), _at(2021, 3, 1)), {"archived_dependent_journey_types": ["BULK"]}, False),
    Example("not archived-dependent and not archived",
            _row("PAYMENT", _at(2021, 2, 1), _at(2021, 3, 1)), {"archived_dependent_journey_types": ["BULK"]}, True),
)


class UnitsOfWorkPlatform(EventWriter):
    """The payment store's writes of units of work, each followed by its event."""

    id_field = "unit_of_work_id"

    def __init__(self, kafka: KafkaConfig, cassandra: CassandraConfig, topic: str, keyspace: str,
                 settings: UnitsOfWorkSettings) -> None:
        super().__init__(kafka, cassandra, topic)
        prepare = self.session.prepare
        units, objects = f"{keyspace}.{settings.units_table}", f"{keyspace}.{settings.objects_table}"
        self._insert_unit = prepare(
            f"INSERT INTO {units} (unit_of_work_id, journey_type, started_at) VALUES (?, ?, ?)")
        self._insert_object = prepare(
            f"INSERT INTO {objects} (unit_of_work_id, collection, object_id, body) VALUES (?, ?, ?, ?)")
        self._insert_object.consistency_level = ConsistencyLevel.QUORUM
        # The writer contract: refused once a purge has claimed the unit, or when the row is gone.
        self._set = {
            column: prepare(f"UPDATE {units} SET {column} = ? WHERE unit_of_work_id = ? "
                            "IF purge_started_at = null AND started_at != null")
            for column in ("finished_at", "archived_at")
        }
        self._read_unit = read_serially(self.session, prepare(f"SELECT * FROM {units} WHERE unit_of_work_id = ?"))
        self._count_objects = prepare(f"SELECT COUNT(*) FROM {objects} WHERE unit_of_work_id = ?")

    def start(self, uow_id: str, journey_type: str, at: datetime, children: int = 0) -> None:
        """A new unit of work: its row, then ``children`` objects over the collections, then ``uow_started``."""
        self.session.execute(self._insert_unit, (uow_id, journey_type, at))
        for number in range(children):
            collection = COLLECTIONS[number % len(COLLECTIONS)]
            self.session.execute(self._insert_object, (uow_id, collection, f"o{number}", f"{uow_id}/{number}".encode()))
        self._emit(UOW_STARTED, uow_id, at, journey_type=journey_type)

    def finish(self, uow_id: str, at: datetime) -> bool:
        """The unit reached a terminal global status; False: it is being purged or gone."""
        return self._change("finished_at", UOW_FINISHED, uow_id, at)

    def archive(self, uow_id: str, at: datetime) -> bool:
        """The unit and its objects were archived; False: it is being purged or gone."""
        return self._change("archived_at", UOW_ARCHIVED, uow_id, at)

    def rows(self, uow_id: str) -> tuple[dict[str, Any] | None, int]:
        """The unit's row (None: gone) and how many objects it has."""
        unit = self.session.execute(self._read_unit, (uow_id,)).one()
        return (unit._asdict() if unit else None), self.session.execute(self._count_objects, (uow_id,)).one()[0]

    def _change(self, column: str, event_type: str, uow_id: str, at: datetime) -> bool:
        if not self.session.execute(self._set[column], (at, uow_id)).was_applied:
            return False
        self._emit(event_type, uow_id, at)
        return True
