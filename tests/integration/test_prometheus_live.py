"""The Grafana dashboard (deploy/grafana/purger-dashboard.json), and the dashboard and the alert rules on a real
Prometheus scraping a real purger.

Without servers: the dashboard is a JSON model Grafana imports (title, uid, schemaVersion, a `${datasource}`
variable, panels with unique ids and places on the grid, each with a Prometheus target), promtool parses
every expr, and every metric an expr reads is one ``PurgerMetrics`` exports or a recording rule of
deploy/prometheus/purger-rules.yml defines.

On the real servers: a purger runs with a keyspace and buckets of its own, and a `prometheus` server (Debian's
package, which `make install` and CI install) scrapes it every second and evaluates the shipped rules every
second, their `for:` cut to seconds. Through Prometheus's HTTP API the test finds series for every panel's
expr, PurgerRecordsDeadLettered firing on a burst of bad records, and PurgerDown pending, firing and resolved
as the metrics endpoint stops answering and answers again. (The dead-letter alert counts over 15 minutes, so
it would resolve only 15 minutes after the burst; a cut endpoint is the fault cheapest to cause and undo.)
Then who reaches that purger: from a network namespace of the test's own (tests.support.exposure), its metrics
endpoint does not answer (it listens on the loopback alone), and the Spark UI's kill endpoints answer and kill
none of its jobs.

Example::

    python -m pytest -s tests/integration/test_prometheus_live.py
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest

from devstack.stack import prepare
from purger.core.settings import PurgerConfig
from purger.core.vocabulary import DEAD_LETTER, DEAD_LETTERED
from purger.metrics import PurgerMetrics
from purger.policies.mailbox.deletes import payload_key
from purger.running import start_purger
from simulation.mailbox import Platform
from tests.support.configs import free_port, mailbox, own_config
from tests.support.exposure import NetworkNamespace, kill_forms, listening_addresses
from tests.support.faults import TcpProxy, bad_records
from tests.support.waits import ago, wait_for
from tests.support.rules import ROOT, RULES, run_promtool

DASHBOARD = ROOT / "deploy" / "grafana" / "purger-dashboard.json"
PROMETHEUS = shutil.which("prometheus")

# Grafana's own variables, filled in as Grafana would; the dashboard's `$instance` as its "All".
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$instance": ".*"}
# Series Prometheus makes itself: the alerts' states.
PROMETHEUS_SERIES = {"ALERTS"}
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "group_left", "group_right", "inf", "nan", "Inf", "NaN"}
GRID_COLUMNS = 24


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def fill(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def exprs(board: dict) -> list[tuple[str, str]]:
    """(where, expr) of every panel's targets and of the query variables' selectors, variables filled in."""
    found = [(f"panel {panel['id']} {panel['title']!r}", target["expr"])
             for panel in board["panels"] for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            selector = re.fullmatch(r"label_values\((.+), \w+\)", variable["query"]).group(1)
            found.append((f"variable ${variable['name']}", selector))
    return [(where, fill(expr)) for where, expr in found]


def metric_names(expr: str) -> set[str]:
    """The metric names an expr reads: its identifiers once strings, label matchers, ranges and grouping
    clauses are taken out, other than functions and aggregations (followed by "(") and keywords."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    return set(re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:]|\s*\()", bare)) - PROMQL_WORDS


def exported() -> set[str]:
    """The series names PurgerMetrics exports, labelled families included before their first sample."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    registry = PurgerMetrics(max_deletions_per_second=1000, reconcile_interval_s=86400).registry
    return {family.name + suffix for family in registry.collect() for suffix in suffixes[family.type]}


def recorded() -> set[str]:
    return set(re.findall(r"^\s+- record: (\S+)$", RULES.read_text(), flags=re.M))


def test_the_dashboard_is_a_grafana_model_on_a_templated_prometheus_datasource():
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    taken: dict[tuple[int, int], str] = {}
    for panel in board["panels"]:
        assert panel["type"] and panel["title"], panel["id"]
        place = panel["gridPos"]
        assert place["x"] >= 0 and place["w"] > 0 and place["x"] + place["w"] <= GRID_COLUMNS, panel["title"]
        for cell in ((x, y) for x in range(place["x"], place["x"] + place["w"])
                     for y in range(place["y"], place["y"] + place["h"])):
            assert cell not in taken, f"{panel['title']!r} overlaps {taken[cell]!r}"
            taken[cell] = panel["title"]
        if panel["type"] == "row":  # a row is a heading over the panels below it, with no query of its own
            continue
        assert panel["datasource"] == datasource, panel["title"]
        assert panel["targets"], f"{panel['title']!r} has no target"
        for target in panel["targets"]:
            assert target["refId"] and target["expr"].strip(), panel["title"]
            assert target["datasource"] == datasource, panel["title"]


def test_every_expr_parses_and_reads_only_what_the_purger_and_its_rules_export(tmp_path):
    found = exprs(dashboard())
    left = [(where, expr) for where, expr in found if "$" in expr]
    assert not left, f"a variable Grafana would not fill in: {left}"
    # promtool parses an expr when it checks a rule that records it. (JSON is YAML, as promtool and
    # prometheus read their files.)
    rules = tmp_path / "dashboard-exprs.yml"
    rules.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": expr} for i, (_, expr) in enumerate(found)]}]}))
    checked = run_promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    known = exported() | recorded() | PROMETHEUS_SERIES
    unknown = {where: sorted(metric_names(expr) - known) for where, expr in found if metric_names(expr) - known}
    assert not unknown, unknown
    assert {"purger_outcomes_total", "purger_state_rows", "purger_reconcile_last_orphans"} <= set().union(
        *(metric_names(expr) for _, expr in found)), "the names were not read: metric_names is broken"


# The shipped rules' `for:` (minutes to hours) cut to this in the test's copy, so that an alert goes pending
# then firing within the test; expressions and thresholds stay the shipped ones.
FOR_IN_TEST_S = 5


class Prometheus:
    """A `prometheus` server of the test's own: a temporary data directory, a free port, the purger's endpoint
    scraped as job "purger" every second, the rules evaluated every second."""

    def __init__(self, home: Path, target: str) -> None:
        home.mkdir()
        rules, cut = re.subn(r"^(\s+for: )\d+[mhd]$", rf"\g<1>{FOR_IN_TEST_S}s", RULES.read_text(), flags=re.M)
        assert cut, f"no `for:` in {RULES}"
        (home / "purger-rules.yml").write_text(rules)
        (home / "prometheus.yml").write_text(json.dumps({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(home / "purger-rules.yml")],
            "scrape_configs": [{"job_name": "purger", "static_configs": [{"targets": [target]}]}],
        }))
        self.log = home / "prometheus.log"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [PROMETHEUS, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(self.ready, 60, f"prometheus to answer on {self.url}")
        except BaseException:
            self.stop()
            raise

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str):
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{urlencode(params)}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def series(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def alert(self, name: str) -> dict | None:
        """The alert ``name`` while pending or firing (one series of it at most here), else None."""
        active = [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name]
        assert len(active) <= 1, active
        return active[0] if active else None

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def prometheus(home: Path, target: str):
    server = Prometheus(home, target)
    try:
        yield server
    finally:
        server.stop()


def check_who_reaches_it(spark, running, own: PurgerConfig, flag: Path) -> None:
    """From a network namespace of the test's own, as from another host: the metrics endpoint (metrics.host's
    default, the loopback alone, as its listening sockets say) refuses the connection that the Spark UI (on every
    interface, Spark's default) accepts; and the UI's kill endpoints, asked to kill every stage and job that runs,
    the purger's and a job of the test's own, with the token of the UI's forms, answer and kill nothing: the test's
    job returns its result, and the purger's query runs on, its next batch done."""
    assert own.metrics.host == "127.0.0.1"
    assert listening_addresses(own.metrics.port) == {"127.0.0.1"}
    sc = spark.sparkContext
    assert sc.getConf().get("spark.ui.killEnabled") == "false"
    ui_port = urlsplit(sc.uiWebUrl).port
    tracker = sc.statusTracker()
    group = f"exposure-{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    result: dict = {}

    def wait_for_flag(path: str) -> str:  # a function of this one's, which the Python workers are sent whole
        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        return path

    def own_job() -> None:  # runs until ``flag`` exists (a task that sleeps would take its core for longer)
        sc.setJobGroup(group, "the exposure check's job")
        try:
            result["value"] = sc.parallelize([str(flag)], 1).map(wait_for_flag).collect()
        except Exception as error:
            result["error"] = error

    waiting = threading.Thread(target=own_job, name=group)
    waiting.start()
    try:
        wait_for(lambda: any(tracker.getJobInfo(job).status == "RUNNING" for job in tracker.getJobIdsForGroup(group))
                 and tracker.getActiveStageIds(), 60, "the test's own job to run")
        print(f"exposure: the test's own job runs after {time.monotonic() - began:.1f} s")
        ours = {stage for job in tracker.getJobIdsForGroup(group) for stage in tracker.getJobInfo(job).stageIds}
        # The pages offer no kill link while jobs run.
        assert kill_forms(sc.uiWebUrl, "/stages/") == [] and kill_forms(sc.uiWebUrl, "/jobs/") == []
        # The token the UI's kill forms carry when kills are on (Spark 4.1.4): without it the endpoints refuse
        # before kills are considered, which would prove nothing about spark.ui.killEnabled.
        token = sc._jsc.sc().ui().get().csrfToken()
        asked_stages: set[int] = set()
        asked_jobs: set[int] = set()
        with NetworkNamespace() as outside:
            assert not outside.connects(own.metrics.port), "the metrics endpoint answered from outside the machine"
            assert outside.connects(ui_port), "the Spark UI did not answer from the namespace: the check proves nothing"

            def ask_to_kill_what_runs() -> bool:
                assert "error" not in result, result["error"]  # the test's job ended before it was asked
                for stage in set(tracker.getActiveStageIds()) - asked_stages:
                    status, location = outside.post(ui_port, "/stages/stage/kill/",
                                                    {"id": str(stage), "terminate": "true", "csrfToken": token})
                    assert status == 302 and location.endswith("/stages/"), (stage, status, location)
                    asked_stages.add(stage)
                for job in set(tracker.getActiveJobsIds()) - asked_jobs:
                    status, location = outside.post(ui_port, "/jobs/job/kill/", {"id": str(job), "csrfToken": token})
                    assert status == 302 and location.endswith("/jobs/"), (job, status, location)
                    asked_jobs.add(job)
                return bool(asked_stages & ours) and bool(asked_stages - ours)  # the purger's stages too

            wait_for(ask_to_kill_what_runs, 60, "kills asked of the test's stage and of the purger's")
        print(f"exposure: {len(asked_stages)} stages and {len(asked_jobs)} jobs asked to be killed after "
              f"{time.monotonic() - began:.1f} s")
        batch = last_batch(running.query)
    finally:
        flag.touch()
        waiting.join(120)
    assert result == {"value": [str(flag)]}, result
    wait_for(lambda: last_batch(running.query) > batch, 60, "the purger's next batch")
    assert running.query.isActive and running.query.exception() is None


def last_batch(query) -> int:
    return (query.lastProgress or {}).get("batchId", -1)


@pytest.mark.skipif(PROMETHEUS is None and not os.environ.get("CI"),
                    reason="no `prometheus` on PATH: `make install` installs it (Debian's prometheus package)")
@pytest.mark.skipif(not NetworkNamespace.available() and not os.environ.get("CI"),
                    reason="a network namespace of the test's own needs root, unshare, nsenter and ip")
def test_on_a_real_prometheus_every_panel_has_series_and_alerts_fire_then_resolve(spark, config, tmp_path):
    assert PROMETHEUS, "CI installs Debian's prometheus package (.ci/run), yet `prometheus` is not on PATH"
    assert NetworkNamespace.available(), "CI runs as root with unshare, nsenter and ip, yet they are not all there"
    began = time.monotonic()

    def lap(what: str, since: float = began) -> float:
        seconds = time.monotonic() - since
        print(f"{what}: {seconds:.1f} s")
        return seconds

    run = uuid.uuid4().hex[:8]
    own = own_config(config, tmp_path, "prometheus")
    # A keyspace and buckets of its own, since its reconcile scans whole tables and lists whole buckets; the
    # reconcile runs at the start (none is recorded yet), and not again within the test.
    stores = {dc: store.model_copy(update={"bucket": f"prometheus-{run}-{dc}"}) for dc, store in own.stores.items()}
    own = own.model_copy(update={
        "cassandra": own.cassandra.model_copy(update={"keyspace": f"prometheus_{run}"}), "stores": stores,
        "reconcile": own.reconcile.model_copy(update={"interval": timedelta(hours=1)})})
    prepare(own, partitions=2)
    lap("its topics, keyspace and buckets")
    platform = Platform(own)
    r = mailbox(own)
    try:
        # What only the reconcile finds, so that its counts have series: two deleted messages whose events are
        # never sent, and a blob with no row in each data centre.
        with platform.holding():
            for i in range(2):
                m = f"silent-{run}-{i}"
                platform.enqueue(m, f"p-{m}", at=ago(r.deleted_ttl))
                platform.delete(m, at=ago(r.deleted_ttl))
        for dc, store in own.stores.items():
            platform.stores[dc].put_object(Bucket=store.bucket, Key=payload_key(f"orphan-{run}"), Body=b"no row")

        running = start_purger(spark, own)
        try:
            # Scraped through a proxy, which a cut makes an endpoint that does not answer.
            proxy = TcpProxy("127.0.0.1", own.metrics.port).start()
            with prometheus(tmp_path / "prometheus", f"127.0.0.1:{proxy.port}") as server:
                lap("purger and prometheus started")
                wait_for(lambda: [s["value"][1] for s in server.series('up{job="purger"}')] == ["1"], 30,
                         "prometheus to scrape the purger")
                # Traffic: messages that expire at once, then a burst of bad records on the events topic.
                for i in range(3):
                    m = f"heard-{run}-{i}"
                    platform.enqueue(m, f"p-{m}", at=ago(r.expired_ttl))
                    platform.dequeue(m, 0, at=ago(r.expired_ttl))
                platform.flush()
                assert server.alert("PurgerRecordsDeadLettered") is None
                burst = bad_records([f"heard-{run}-0"], 20)
                platform.send([(key, value) for _, key, value in burst])
                platform.flush()
                sent = time.monotonic()

                # No `for:` in its rule: it fires at the first evaluation that counts a dead letter, with no
                # pending state. It counts over 15 minutes, so it resolves 15 minutes after the burst: the
                # unit tests (purger-rules.test.yml) show that; the resolution below is PurgerDown's.
                def dead_lettered() -> float:
                    return running.metrics.registry.get_sample_value(
                        "purger_outcomes_total", {"kind": DEAD_LETTER, "status": DEAD_LETTERED})

                def dead_letters_counted() -> bool:
                    alert = server.alert("PurgerRecordsDeadLettered")
                    # Every record the test sent, dead-lettered (the clock tick among them too: it is no watermark).
                    return alert is not None and dead_lettered() == len(burst) and float(alert["value"]) >= dead_lettered()

                wait_for(dead_letters_counted, 120, "PurgerRecordsDeadLettered to count the purger's dead letters")
                alert = server.alert("PurgerRecordsDeadLettered")
                lap("dead-letter alert firing after the burst", sent)
                assert alert["state"] == "firing"
                assert alert["labels"]["severity"] == "warning" and alert["labels"]["job"] == "purger"
                assert alert["annotations"]["runbook_url"] == "docs/operations.md#purgerrecordsdeadlettered"

                # (a) Every expr of the dashboard has series.
                found = exprs(dashboard())
                empty: list[str] = []

                def every_expr_has_series() -> bool:
                    empty[:] = [f"{where}: {expr}" for where, expr in found if not server.series(expr)]
                    return not empty

                try:
                    wait_for(every_expr_has_series, 150, "every panel's expr to have series")
                except AssertionError:
                    raise AssertionError("exprs without series:\n" + "\n".join(empty)) from None
                lap("every expr with series")
                alerts = {s["metric"]["alertname"]: s["metric"]["alertstate"]
                          for s in server.series('ALERTS{alertname=~"Purger.*"}')}
                assert alerts.get("PurgerRecordsDeadLettered") == "firing", alerts
                # The reconcile's counts as Prometheus has them: the two silent messages (and the heard ones if it
                # scanned them before the stream knew them), one orphan blob per data centre.
                fed = server.series('purger_reconcile_last_rows{table="messages", count="unknown_fed"}')
                assert len(fed) == 1 and 2 <= float(fed[0]["value"][1]) <= 5, fed
                deleted = server.series('purger_reconcile_last_orphans{table="payloads", dc!="all", '
                                        'count="orphans_deleted"}')
                assert {s["metric"]["dc"]: s["value"][1] for s in deleted} == {dc: "1" for dc in own.stores}

                # (b) The endpoint stops answering: PurgerDown goes pending, fires after its (shortened) `for:`,
                # and resolves at the first evaluation after it answers again.
                assert server.alert("PurgerDown") is None
                states: list[str | None] = [None]

                def down_is(state: str | None) -> bool:
                    alert = server.alert("PurgerDown")
                    now = alert and alert["state"]
                    if now != states[-1]:
                        states.append(now)
                    return now == state

                proxy.cut()
                cut = time.monotonic()
                try:
                    wait_for(lambda: down_is("pending"), 30, "PurgerDown pending")
                    lap("PurgerDown pending after the cut", cut)
                    wait_for(lambda: down_is("firing"), 30, "PurgerDown firing")
                    fired_s = lap("PurgerDown firing after the cut", cut)
                finally:
                    proxy.restore()
                restored = time.monotonic()
                wait_for(lambda: down_is(None), 30, "PurgerDown to resolve")
                lap("PurgerDown resolved after the restore", restored)
                assert states == [None, "pending", "firing", None]
                assert fired_s >= FOR_IN_TEST_S
            # (c) Who reaches it: the metrics endpoint only from this machine, the UI's kills do nothing. Last, so
            # that its job of its own takes no core from the batches the alerts above wait for.
            checked = time.monotonic()
            check_who_reaches_it(spark, running, own, tmp_path / "exposure-job-may-end")
            lap("who reaches it", checked)
        finally:
            running.stop()
        assert running.failure is None
    finally:
        platform.session.execute(f"DROP KEYSPACE IF EXISTS {own.cassandra.keyspace}", timeout=60)
        platform.close()
    lap("whole test")
