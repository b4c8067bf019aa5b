"""The figures table of BENCHMARKS.md from bench/results.jsonl: the latest run of each figure at each size it
was taken at (its ``messages``, else its ``rows``), but runs of a change tried and not kept (``not_kept``).

    python -m bench.table
"""

from __future__ import annotations

import json
from typing import Any

from bench.common import RESULTS


def _number(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}" if abs(value) >= 100 else f"{value:,.1f} {unit}"


def main() -> None:
    latest: dict[tuple[str, str, Any], dict] = {}
    for line in RESULTS.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("not_kept"):  # a run of a change tried and reverted: the code measured is not the product's
            continue
        # The file is in time order.
        latest[(entry["bench"], entry["figure"], entry.get("messages", entry.get("rows")))] = entry
    print("| figure | command | value | baseline (same run) | ratio | target | commit |")
    print("|---|---|---|---|---|---|---|")
    for entry in latest.values():
        baseline = (f"{entry['baseline']}: {_number(entry['baseline_value'], entry['unit'])}"
                    if "baseline" in entry else "")
        ratio = f"{entry['ratio']:.2f}" if entry.get("ratio") is not None else ""
        print(f"| {entry['figure']} | `{entry['command']}` | {_number(entry['value'], entry['unit'])} | {baseline} "
              f"| {ratio} | {entry.get('target', '')} | {entry.get('commit', '')} |")


if __name__ == "__main__":
    main()
