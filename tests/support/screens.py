"""What the command line prints, as a person at an 80-column terminal sees it."""

from __future__ import annotations

from rich.console import Console


def at_80(renderable) -> list[str]:
    """The lines ``renderable`` prints at 80 columns; fails the test if any is wider or cut short."""
    console = Console(width=80, record=True)
    console.print(renderable)
    lines = console.export_text().splitlines()
    text = "\n".join(lines)
    assert "…" not in text, text
    assert max(len(line) for line in lines) <= 80, text
    return lines
