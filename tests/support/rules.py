"""The Prometheus rules shipped in deploy/prometheus/, as the tests read them: their files, each alert's text, and
promtool run beside them."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from tests.support import ROOT

RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "purger-rules.yml"
RULE_TESTS = RULES_DIR / "purger-rules.test.yml"


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    """promtool in deploy/prometheus/; the calling test fails (not skips) when it is not installed."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not on PATH: `make install` installs it (Debian's prometheus package; "
                    "or `apt-get install prometheus`)")
    return subprocess.run([promtool, *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=120)


def alerts() -> dict[str, str]:
    """Each alerting rule's text, by alert name."""
    blocks = re.split(r"^      - (?=alert: |record: )", RULES.read_text(), flags=re.M)
    return {re.match(r"alert: (\w+)", block).group(1): block for block in blocks if block.startswith("alert: ")}
