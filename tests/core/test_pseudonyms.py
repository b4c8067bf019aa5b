"""A pseudonymised ledger (SPEC 11.3, ``ledger.pseudonymise``): ids as keyed hashes, reasons as their category,
and an object's records found from its id; on the real files, nothing of the ids in clear."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, strategies as st
from pydantic import SecretStr

from purger.config import build_config
from purger.core.settings import ConfigError, LedgerConfig
from purger.core.pseudonyms import Pseudonyms
from purger.core.vocabulary import PURGED, SKIPPED
from tests.support.configs import write_config
from tests.support import ROOT

KEY = "k3y-of-the-tests-0123456789abcdef-0123456789"


def pseudonymised(key: str = KEY) -> Pseudonyms:
    return Pseudonyms.of(LedgerConfig(pseudonymise=True, pseudonym_key=key))


@given(st.text(min_size=1))
def test_an_id_is_its_hmac_sha256_under_the_key_and_itself_when_off(object_id):
    expected = hmac.new(KEY.encode(), object_id.encode(), hashlib.sha256).hexdigest()
    assert pseudonymised().id(object_id) == expected != pseudonymised(KEY + "2").id(object_id)
    assert Pseudonyms.of(LedgerConfig()).id(object_id) == object_id


def test_a_reason_keeps_its_category_and_a_scope_its_kind():
    names = pseudonymised()
    assert names.reason("held: mailbox:alice since 2026-11-28 by jdoe: case 43") == "held"
    assert names.reason("live: extract_count 3") == "live" and names.reason(None) is None
    assert names.scope("mailbox:alice:work") == f"mailbox:{names.id('alice:work')}"
    off = Pseudonyms.of(LedgerConfig())
    assert off.reason("live: extract_count 3") == "live: extract_count 3" and off.scope("mailbox:a") == "mailbox:a"
    assert KEY not in repr(names)


def test_pseudonymise_without_a_key_is_refused_in_a_line_naming_the_key_and_its_variable(monkeypatch):
    monkeypatch.delenv("PURGER_LEDGER_PSEUDONYM_KEY", raising=False)
    with pytest.raises(ConfigError) as refused:
        build_config({"ledger": {"pseudonymise": True}})
    [line] = [line for line in str(refused.value).splitlines() if "pseudonymise" in line]
    assert "ledger.pseudonym_key" in line and "PURGER_LEDGER_PSEUDONYM_KEY" in line
    monkeypatch.setenv("PURGER_LEDGER_PSEUDONYM_KEY", KEY)
    config = build_config({"ledger": {"pseudonymise": True}})
    assert config.ledger.pseudonym_key.get_secret_value() == KEY and KEY not in str(config.ledger)


# --- on a real ledger ------------------------------------------------------------------------------------


def outcome(object_id: str, kind: str, status: str, reason: str | None, dc: str | None = None) -> tuple:
    now = int(time.time() * 1000)
    return ("mailbox", kind, object_id, "deleted", dc, status, reason, now - 5_000, now,
            now if status == PURGED else None, 3, "host:1", None)


def sql_executions_since(spark, after: int) -> list[int]:
    """The ids of the SQL executions after ``after`` that the Spark UI keeps, oldest first."""
    store = spark._jsparkSession.sharedState().statusStore()
    count = store.executionsCount()
    newest = store.executionsList(max(0, count - 1000), 1000)
    return [i for i in (newest.apply(n).executionId() for n in range(newest.size())) if i > after]


@pytest.mark.integration
def test_a_pseudonymised_ledger_holds_no_id_in_clear_and_finds_each_objects_records(spark, config, tmp_path):
    """Records appended as the purge appends them (a batch, then the same batch again, as a retry writes it): the
    ledger's files (Parquet, the Delta log with its column statistics, the change feed) hold none of the ids,
    mailbox names or reason details written, nor the key; each object's records are found from its id, by
    ``Ledger.find`` and by `purger ledger find`; with another key, none. The key is in no plan the Spark UI
    shows."""
    from purger.sinks.ledger import Ledger
    from purger.sinks.purge import OUTCOME_SCHEMA

    ledger_config = config.ledger.model_copy(update={
        "path": str(tmp_path / "records"), "report_path": str(tmp_path / "report"), "pseudonymise": True,
        "pseudonym_key": SecretStr(KEY)})
    before = max(sql_executions_since(spark, -1), default=-1)
    ledger = Ledger(spark, ledger_config)
    ledger.create()
    message, payload, mailbox = "msg-alice-7f3a1c", "payload-alice-7f3a1c", "mailbox-of-alice"
    outcomes = [outcome(message, "message", PURGED, None),
                outcome(payload, "payload", PURGED, None, "dc1"),
                outcome(f"{message}-kept", "message", SKIPPED, f"held: mailbox:{mailbox} since now by jdoe: case")]
    for retry in (False, True):  # the same batch again: each record once
        ledger.append(spark.createDataFrame(outcomes, OUTCOME_SCHEMA), "query-1", 3, may_hold=retry)

    written = b"".join(path.read_bytes() for path in tmp_path.rglob("*") if path.is_file())
    clear = [text for text in (message, payload, mailbox, "jdoe", KEY) if text.encode() in written]
    assert clear == [] and b"held" in written

    found = ledger.find(message)
    assert [(r.kind, r.status, r.reason, r.id) for r in found] == [
        ("message", PURGED, None, Pseudonyms.of(ledger_config).id(message))]
    assert [(r.status, r.reason) for r in ledger.find(f"{message}-kept", kind="message")] == [(SKIPPED, "held")]
    assert [(r.kind, r.dc) for r in ledger.find(payload)] == [("payload", "dc1")]
    # The day the records were decided on, from their own time: a test run across midnight still finds them.
    today = datetime.fromtimestamp(outcomes[1][8] / 1000, timezone.utc).date()
    assert [r.kind for r in ledger.find(payload, since=today)] == ["payload"]
    assert ledger.find(payload, since=today + timedelta(days=1)) == []
    other = Ledger(spark, ledger_config.model_copy(update={"pseudonym_key": SecretStr(KEY + "-another")}))
    assert other.find(message) == []
    # What `purger hold message:<id>` lists of the batch it waited for: the message, by its hash.
    from purger.core.holds import Scope
    from purger.holds import purged_by

    held = config.model_copy(update={"ledger": ledger_config})
    assert purged_by(spark, held, ["mailbox"], "query-1", 3, int(time.time() * 1000) - 60_000,
                     Scope("message", message)) == [("message", Pseudonyms.of(ledger_config).id(message), None)]

    # Each SQL query this test ran, as the UI's REST API shows it with its plan (the UI keeps the newest 1,000
    # of a session, so the oldest ones of a long test session are not where to look).
    ours = sql_executions_since(spark, before)
    assert ours, "the ledger's queries should be in the Spark UI"
    api = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/sql"
    for execution in ours:
        with urllib.request.urlopen(f"{api}/{execution}?details=true&planDescription=true", timeout=30) as response:
            assert KEY not in response.read().decode(), execution

    # The command, as an auditor runs it: the key from the environment, never on its command line.
    config_file = write_config(config.model_copy(update={"ledger": ledger_config}), tmp_path / "purger.toml",
                               leaving_out=frozenset({"ledger.pseudonym_key"}))
    assert KEY not in config_file.read_text()
    run = subprocess.run([sys.executable, "-m", "purger", "ledger", "find", message, "--json", "--since",
                          today.isoformat(), "--config", str(config_file)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PURGER_LEDGER_PSEUDONYM_KEY": KEY})
    assert run.returncode == 0, run.stderr[-2000:]
    [record] = json.loads(run.stdout)
    assert (record["kind"], record["status"], record["batch_id"]) == ("message", PURGED, 3)
