"""The control topic's protocol: the one loop back from the sink to the stateful stage, on purpose.

Structured Streaming has no path from a sink back to the state, so the purger
writes its own events to ``kafka.control_topic``, which the query reads (from
its end on a fresh checkpoint: a replay rebuilds them from the events):

- ``clock``: a tick stamped with the time up to which the query has read the
  events (``streams.clock``), the wall clock once it has read them all; the
  only thing that moves the watermark;
- ``recheck``: look at an object again at ``event_time`` (the double-check kept
  it and the row says when it will be due, or a store or Cassandra failed),
  with ``kind``, ``rule`` and the object's id in its kind's id field;
- a policy's own control events (``EventType.control``), e.g. the mailbox's
  ``payload_released``.

Here the protocol is written (``ControlWriter``, ``tick``), validated
(``control_errors``) and routed (``control_target``); ``streams.parse`` and
``streams.processor`` call these. Control events are accepted from the control
topic only, so a producer on the events topics cannot steer the purger. They
are keyed like the objects they name and idempotent: a retried batch that sends
them twice changes nothing. Each is delivered before the batch ends: the
task's flush waits for them, and fails the task, which runs again, if Kafka did
not take one (``connectors.CheckedProducer``); a committed batch never loses
one.

Example::

    control = ControlWriter(producer, "purger.control", policies)
    control.recheck("message", "m1", "expired_by_date", at_ms=1_767_254_280_000)
    control.flush()
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from purger.connectors import TASK_RUNS_AGAIN
from purger.core.events import EventField
from purger.core.handles import Control
from purger.core.policy_set import PolicySet
from purger.core.times import format_epoch_ms, format_timestamp
from purger.core.vocabulary import CLOCK

if TYPE_CHECKING:
    from pyspark.sql import Column

    from purger.connectors import CheckedProducer

RECHECK = "recheck"
# The engine's control event types; each policy may add its own (``EventType.control``).
ENGINE_TYPES = (CLOCK, RECHECK)
# A recheck's fields; the object's id is in its kind's id field.
FIELDS = (EventField("kind", "string", identifier=True), EventField("rule", "string", identifier=True))


def tick(at_ms: int | None = None) -> bytes:
    """A clock event stamped ``at_ms`` (epoch milliseconds), by default the wall clock."""
    stamp = format_timestamp(datetime.now(timezone.utc)) if at_ms is None else format_epoch_ms(at_ms)
    return json.dumps({"event_id": f"clock-{uuid.uuid4()}", "type": CLOCK, "event_time": stamp}).encode()


class ControlWriter(Control):
    """The sink's reports, on the control topic. ``fields`` ending in ``_ms`` are written as the events'
    timestamps without that suffix (``observed_at_ms`` -> ``observed_at``)."""

    def __init__(self, producer: "CheckedProducer", topic: str, policies: PolicySet) -> None:
        self.producer = producer
        self.topic = topic
        self.policies = policies

    def _send(self, key: str, event: dict[str, Any]) -> None:
        event = {"event_id": str(uuid.uuid4()), **event}
        self.producer.send(self.topic, key=key.encode(), value=json.dumps(event).encode())

    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        self._send(object_id, {"type": RECHECK, "kind": kind, self.policies.id_field(kind): object_id, "rule": rule,
                               "event_time": format_epoch_ms(at_ms)})

    def report(self, event_type: str, object_id: str, event_time_ms: int, **fields: Any) -> None:
        id_field = self.policies.event_types[event_type].id_field
        written = {(k[:-3] if k.endswith("_ms") else k): (format_epoch_ms(v) if k.endswith("_ms") else v)
                   for k, v in fields.items()}
        self._send(object_id, {"type": event_type, id_field: object_id, "event_time": format_epoch_ms(event_time_ms),
                               **written})

    def flush(self) -> None:
        """Wait until every report sent before it is delivered; ``connectors.NotDelivered`` if one was not,
        which fails the sink's task."""
        self.producer.flush(TASK_RUNS_AGAIN)


def control_types(policies: PolicySet) -> list[str]:
    """Every event type accepted on the control topic only."""
    return [*ENGINE_TYPES, *(t.name for t in policies.event_types.values() if t.control)]


def control_errors(typed: "Column", policies: PolicySet) -> list[tuple["Column", "Column"]]:
    """(condition, reason) of a bad control event, given the typed record."""
    from pyspark.sql import functions as F

    kinds = [k.name for k in policies.kinds]
    recheck = typed["type"] == RECHECK
    checks = [(recheck & typed[f.name].isNull(), F.lit(f"{RECHECK} event lacks field {f.name}")) for f in FIELDS]
    checks.append((recheck & ~typed["kind"].isin(*kinds),
                   F.lit(f"recheck event kind is none of the enabled policies' ({', '.join(kinds)})")))
    for kind in kinds:
        id_field = policies.id_field(kind)
        checks.append((recheck & (typed["kind"] == kind) & typed[id_field].isNull(),
                       F.lit(f"recheck event of a {kind} lacks field {id_field}")))
    return checks


def control_target(policies: PolicySet) -> tuple["Column", "Column"]:
    """The (kind, id) a clock tick or a recheck is about (a tick: ``clock`` and no id); null for others."""
    from pyspark.sql import functions as F

    t = F.col("type")
    recheck_id = None
    for kind in policies.kinds:
        this = F.col("kind") == kind.name
        value = F.col(policies.id_field(kind.name))
        recheck_id = F.when(this, value) if recheck_id is None else recheck_id.when(this, value)
    kind = F.when(t == CLOCK, F.lit(CLOCK)).when(t == RECHECK, F.col("kind"))
    object_id = F.when(t == CLOCK, F.lit("")).when(t == RECHECK, recheck_id)
    return kind, object_id
