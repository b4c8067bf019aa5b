"""A page of ``messages`` rows judged on whole columns, for reconciliation's scan: the same verdict as folding
each row's ``message_events`` (``purger.reconcile.verdict.row_verdict``), at a fraction of the cost.

Per row, in columns: the row's last change (``deletes.last_change``), its events (``message_events``: an
enqueue at ``created_at``, then at the last change what the row says), their fold (``state.apply``; the
enqueue's empty counter and date are registers set at ``created_at``, so a change dated before it loses), and
the earliest rule (``rules.eligibility``; ties go to the rule whose name sorts first). Each rule's start is
named beside the rule it feeds, in the order of its table. tests/reconcile/test_verdict.py holds the two ways
equal on generated rows, ties and missing cells included.

Example::

    verdicts = message_verdicts(Retention(), columns)   # columns: name -> the page's values
    verdicts.rules[0], verdicts.eligible_at_ms[0]       # ('expired_by_counter', 1767225600000)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from purger.core.reconcile_descriptors import PageVerdicts
from purger.core.times import nearest_ms
from purger.policies.mailbox.deletes import MESSAGES
from purger.policies.mailbox.rules import DELETED, EXPIRED_BY_COUNTER, EXPIRED_BY_DATE, INCOMPLETE, Retention


def _values(values: list[Any], kind: pa.DataType) -> tuple[np.ndarray, np.ndarray]:
    """A column as int64 values (0 where null) and whether each is set."""
    column = pa.array(values, type=kind)
    present = column.is_valid().to_numpy(zero_copy_only=False)
    if kind == pa.bool_():
        return column.fill_null(False).to_numpy(zero_copy_only=False), present
    return column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), present


def _epoch_ms(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """A timestamp column (the driver's datetimes, naive, in UTC) in epoch milliseconds as ``epoch_ms`` gives each,
    the nearest (Arrow's cast to milliseconds truncates), and whether each is set."""
    micros, present = _values(values, pa.timestamp("us"))
    return nearest_ms(micros), present


def _set(values: list[Any]) -> np.ndarray:
    return np.fromiter((value is not None for value in values), dtype=bool, count=len(values))


def message_verdicts(retention: Retention, columns: dict[str, list[Any]]) -> PageVerdicts:
    created, has_created = _epoch_ms(columns["created_at"])
    updated, has_updated = _epoch_ms(columns["updated_at"])
    count, has_count = _values(columns["extract_count"], pa.int64())
    until, has_until = _epoch_ms(columns["extract_until"])
    complete, has_complete = _values(columns["complete"], pa.bool_())
    deleted, _ = _values(columns["deleted"], pa.bool_())
    # The last change: updated_at, else the latest write time of the cells (microseconds), no earlier than created_at.
    write_times = [_values(columns[f"writetime_{column}"], pa.int64()) for column in MESSAGES.written]
    # Any write time, one before 1970 too, outranks a cell without one.
    unset = np.iinfo(np.int64).min
    written = np.max([np.where(present, micros // 1000, unset) for micros, present in write_times], axis=0)
    has_written = np.any([present for _, present in write_times], axis=0)
    written = np.where(has_created, np.maximum(written, created), written)
    has_last = has_updated | has_written
    last = np.where(has_updated, updated, written)

    enqueued = has_created & _set(columns["mailbox"]) & _set(columns["payload_id"]) & _set(columns["payload_size"])
    # The counter and the date: registers the enqueue sets empty at created_at, which a later change outranks.
    registers = has_last & (~enqueued | (last >= created))
    says = has_last & (enqueued | complete | has_count | has_until | deleted)

    starts = {  # each rule's start, where it applies, in the order of the rules' table
        EXPIRED_BY_COUNTER: (last, registers & has_count & (count == 0)),
        EXPIRED_BY_DATE: (until, registers & has_until),
        INCOMPLETE: (created, has_last & enqueued & has_complete & ~complete),
        DELETED: (last, has_last & deleted),
    }
    rules = retention.message_rules
    rows = len(created)
    due_at = np.zeros(rows, dtype=np.int64)
    rule_at = np.full(rows, -1)
    names = sorted(starts)
    for index, name in enumerate(names):
        start, applies = starts[name]
        at = start + rules[name].period_ms
        earlier = applies & ((rule_at < 0) | (at < due_at))
        due_at = np.where(earlier, at, due_at)
        rule_at = np.where(earlier, index, rule_at)
    return PageVerdicts(says.tolist(), [names[i] if i >= 0 else None for i in rule_at.tolist()],
                        [int(at) if i >= 0 else None for at, i in zip(due_at.tolist(), rule_at.tolist())])
