"""Helpers shared by the tests: configurations, waits, fault injection, and the mailbox platform's cases."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository's root, wherever a test module lies below tests/
