"""What the command line prints: tables and durations a person reads, apart from the commands' parsing
(``purger.cli``).

Example::

    from purger.output import report_table
    Console().print(report_table(rows, "Purge report 2026-11-24"))
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.table import Table

def report_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The daily purge report's rows (``sinks.ledger.Report.rows``) as a table: a column per kind and
    data centre, a line per figure, so it fits a terminal."""
    from purger.core.vocabulary import STATUSES

    def shown(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.1f}"
        if isinstance(value, datetime):
            return f"{value:%H:%M:%S}"
        if isinstance(value, dict):
            return ", ".join(f"{k} {v}" for k, v in sorted(value.items())) or "-"
        return str(value)

    table = Table(title=title)
    table.add_column("")
    for r in rows:
        table.add_column(f"{r['policy']}: {r['kind']} {r['dc']}", justify="right")
    for figure in ("candidates", *STATUSES, "skipped_by_reason", "lag_p50_s", "lag_p95_s", "lag_p99_s",
                   "started_at", "finished_at", "duration_s"):
        table.add_row(figure.replace("_", " "), *(shown(r[figure]) for r in rows))
    for name in sorted({k for r in rows for k in (r["policy_fields"] or {})}):
        table.add_row(name.replace("_", " "), *(shown((r["policy_fields"] or {}).get(name)) for r in rows))
    return table


