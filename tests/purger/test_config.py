import re
from datetime import timedelta

import pytest

from purger.core.settings import ConfigError, parse_duration

from purger.cli import _with_dry_run
from purger.config import build_config, load_config
from tests.support import ROOT
from tests.support.configs import mailbox


def test_defaults_are_the_specs():
    retention = mailbox(build_config({}))
    assert retention.expired_ttl == timedelta(days=30)
    assert retention.incomplete_ttl == timedelta(days=2)
    assert retention.deleted_ttl == timedelta(0)
    assert retention.payload_grace == timedelta(hours=12)


@pytest.mark.parametrize(
    "text, expected",
    [("30d", timedelta(days=30)), ("12h", timedelta(hours=12)), ("10m", timedelta(minutes=10)),
     ("5s", timedelta(seconds=5)), ("250ms", timedelta(milliseconds=250)), (0, timedelta(0))],
)
def test_durations(text, expected):
    assert parse_duration(text) == expected


def test_a_bad_value_names_the_key_and_what_it_accepts():
    with pytest.raises(ConfigError) as error:
        build_config({"kafka": {"starting_offsets": "yesterday"}})
    assert "kafka.starting_offsets" in str(error.value)
    assert "'earliest'" in str(error.value) and "'latest'" in str(error.value)


def test_a_bad_duration_names_the_key_and_the_units():
    with pytest.raises(ConfigError) as error:
        build_config({"policies": {"mailbox": {"expired_ttl": "a month"}}})
    assert "policies.mailbox.expired_ttl" in str(error.value)
    assert "ms, s, m, h or d" in str(error.value)


def test_an_unknown_key_is_refused():
    with pytest.raises(ConfigError, match="policies.mailbox.expird_ttl: unknown key"):
        build_config({"policies": {"mailbox": {"expird_ttl": "1d"}}})


@pytest.mark.parametrize("raw, line", [
    ({"stream": {"trigger_intervl": "2s"}}, "stream.trigger_intervl: unknown key; did you mean trigger_interval?"),
    ({"strem": {}}, "strem: unknown key; did you mean stream?"),
    # Through a table of sections, an optional section and a section in a section.
    ({"stores": {"dc1": {"bucket": "dc1", "endpont": "http://s3"}}},
     "stores.dc1.endpont: unknown key; did you mean endpoint?"),
    ({"cassandra": {"tls": {"ca_file": "ca.pem", "check_hostnam": False}}},
     "cassandra.tls.check_hostnam: unknown key; did you mean check_hostname?"),
    ({"kafka": {"security": {"protocl": "SSL"}}}, "kafka.security.protocl: unknown key; did you mean protocol?"),
    # Nothing near: no guess.
    ({"stream": {"colour": "blue"}}, "stream.colour: unknown key\n"),
])
def test_an_unknown_key_names_the_closest_valid_one(raw, line):
    with pytest.raises(ConfigError) as error:
        build_config(raw)
    assert line in f"{error.value}\n"


def test_the_closest_key_is_found_at_any_depth_of_a_model():
    from purger.core.settings import PurgerConfig, closest_key

    assert closest_key(PurgerConfig, ("ledger", "s3", "acces_key")) == "access_key"
    assert closest_key(PurgerConfig, ("stream", "nothing_like_it")) is None
    assert closest_key(PurgerConfig, ("policies", "mailbox", "expird_ttl")) is None  # free keys: the policy's own


def test_environment_overrides_endpoints(monkeypatch):
    monkeypatch.setenv("PURGER_CASSANDRA_HOSTS", "db1:9142,db2:9142")
    monkeypatch.setenv("PURGER_S3_ENDPOINT", "http://s3.local:9000")
    config = build_config({})
    assert config.cassandra.hosts == ["db1", "db2"] and config.cassandra.port == 9142
    assert {s.endpoint for s in config.stores.values()} == {"http://s3.local:9000"}


def test_toml_file(tmp_path):
    path = tmp_path / "purger.toml"
    path.write_text('[policies.mailbox]\nexpired_ttl = "7d"\n[stores.paris]\nbucket = "blobs-paris"\n')
    config = load_config(path)
    assert mailbox(config).expired_ttl == timedelta(days=7)
    assert list(config.stores) == ["paris"]


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_the_readme_example_is_a_valid_configuration(tmp_path):
    """The TOML block under "Configuration" in the README is the documented one; it must load as is."""
    readme = (ROOT / "README.md").read_text()
    example = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "purger.toml"
    path.write_text(example)
    config = load_config(path)
    assert mailbox(config) == mailbox(build_config({}))
    assert config.kafka.control_topic == "purger.control" and config.stream.retry_interval == timedelta(minutes=1)


def test_a_payload_grace_under_the_clock_skew_is_refused():
    with pytest.raises(ConfigError, match="policies.mailbox.payload_grace: .*at least 1s"):
        build_config({"policies": {"mailbox": {"payload_grace": "0s"}}})


def test_a_ledger_retention_under_a_day_is_refused():
    assert build_config({}).ledger.retention == timedelta(days=400)
    with pytest.raises(ConfigError, match="ledger.retention: .*at least 1d"):
        build_config({"ledger": {"retention": "12h"}})
def test_an_orphan_grace_under_24_hours_is_refused_naming_the_key_and_what_to_do():
    with pytest.raises(ConfigError) as error:
        build_config({"reconcile": {"orphan_grace": "86399s"}})
    assert re.search(r"^  reconcile: .*orphan_grace under 24h .*raise it, or set orphan_grace_check = false",
                     str(error.value), flags=re.MULTILINE), str(error.value)


def test_an_orphan_grace_of_24_hours_is_accepted():
    assert build_config({"reconcile": {"orphan_grace": "24h"}}).reconcile.orphan_grace == timedelta(hours=24)


def test_an_orphan_grace_under_24_hours_is_accepted_with_the_check_off():
    reconcile = build_config({"reconcile": {"orphan_grace": "2s", "orphan_grace_check": False}}).reconcile
    assert reconcile.orphan_grace == timedelta(seconds=2) and reconcile.orphan_grace_check is False


def test_a_dry_run_has_a_checkpoint_of_its_own():
    config = build_config({"stream": {"checkpoint": "cp", "dry_run": True}})
    assert config.stream.checkpoint_location == "cp.dry-run"
    assert build_config({"stream": {"checkpoint": "cp"}}).stream.checkpoint_location == "cp"


def test_a_dry_run_has_a_control_topic_of_its_own():
    """SPEC 9.5: its ticks and reports go where the real purger does not read, from the file or the flag."""
    real = build_config({"kafka": {"control_topic": "ops.control"}})
    assert real.kafka.control_topic == "ops.control"
    from_file = build_config({"kafka": {"control_topic": "ops.control"}, "stream": {"dry_run": True}})
    assert from_file.kafka.control_topic == "ops.control.dry-run"
    from_flag = _with_dry_run(real, True)  # `purger run --dry-run`, `purger replay --dry-run`
    assert (from_flag.stream.dry_run, from_flag.kafka.control_topic) == (True, "ops.control.dry-run")
    assert from_flag.policy_set is real.policy_set
    # A dry run's configuration is its own dry run, written to a file and read back included.
    assert from_file.as_dry_run().kafka.control_topic == "ops.control.dry-run"
    assert _with_dry_run(from_file, True).kafka.control_topic == "ops.control.dry-run"
    assert build_config({"kafka": {"control_topic": "ops.control.dry-run"},
                         "stream": {"dry_run": True}}).kafka.control_topic == "ops.control.dry-run"
    assert _with_dry_run(real, False) is real


def test_a_real_purger_on_a_dry_runs_control_topic_is_refused():
    with pytest.raises(ConfigError, match=r"kafka.control_topic: ops.control.dry-run ends in .dry-run, as a dry "
                                          r"run's control topic does; name a real purger's otherwise"):
        build_config({"kafka": {"control_topic": "ops.control.dry-run"}})


def test_a_dry_run_has_a_dead_letter_topic_and_a_ledger_of_its_own():
    """SPEC 9.5: no Delta commit of a dry run on a real purger's tables, no bad record twice on the real dead-letter
    topic; a path's is beside it, local or s3a://, with or without a trailing slash."""
    raw = {"kafka": {"dead_letter_topic": "ops.dead-letter"},
           "ledger": {"path": "s3a://audit/ledger/records/", "report_path": "ledger/report",
                      "reconcile_path": "s3a://audit/reconciles"}}
    real = build_config(raw)
    for dry in (_with_dry_run(real, True), build_config({**raw, "stream": {"dry_run": True}})):
        assert (dry.kafka.dead_letter_topic, dry.ledger.path, dry.ledger.report_path, dry.ledger.reconcile_path) == (
            "ops.dead-letter.dry-run", "s3a://audit/ledger/records.dry-run", "ledger/report.dry-run",
            "s3a://audit/reconciles.dry-run")
        assert dry.kafka.reconcile_topic == real.kafka.reconcile_topic  # read, never written by a dry run
        assert dry.as_dry_run().kafka == dry.kafka and dry.as_dry_run().ledger == dry.ledger
    assert (real.kafka.dead_letter_topic, real.ledger.path) == ("ops.dead-letter", "s3a://audit/ledger/records/")
    assert build_config({"stream": {"checkpoint": "cp/", "dry_run": True}}).stream.checkpoint_location == "cp.dry-run"
    # A bucket's root has nothing beside it: s3a://audit.dry-run would be another bucket.
    with pytest.raises(ConfigError, match=r"^ledger.report_path: s3a://audit/ is a bucket's root"):
        build_config({"ledger": {"report_path": "s3a://audit/"}}).as_dry_run()


@pytest.mark.parametrize("key, what", [
    ("kafka.dead_letter_topic", "dead-letter topic"), ("ledger.path", "ledger"), ("ledger.report_path", "daily report"),
    ("ledger.reconcile_path", "reconcile report"), ("stream.checkpoint", "checkpoint")])
def test_a_real_purger_on_a_dry_runs_name_is_refused_in_a_line_naming_the_key(key, what):
    section, name = key.split(".")
    with pytest.raises(ConfigError) as error:
        build_config({section: {name: "ops/x.dry-run/"}})
    assert str(error.value).splitlines()[1].endswith(
        f"{key}: ops/x.dry-run/ ends in .dry-run, as a dry run's {what} does; name a real purger's otherwise")
    assert build_config({section: {name: "ops/x.dry-run/"}, "stream": {"dry_run": True}})  # a dry run's own


def test_operations_keys_are_checked():
    with pytest.raises(ConfigError, match="stream.max_deletions_per_second"):
        build_config({"stream": {"max_deletions_per_second": 0}})
    with pytest.raises(ConfigError, match="stream.delete_concurrency: Input should be less than or equal to 256"):
        build_config({"stream": {"delete_concurrency": 1000}})
    with pytest.raises(ConfigError, match="ledger.s3.endpont: unknown key"):
        build_config({"ledger": {"s3": {"endpont": "http://x"}}})
    with pytest.raises(ConfigError, match="metrics.port"):
        build_config({"metrics": {"port": 70000}})


@pytest.mark.parametrize("host, url", [
    ("127.0.0.1", "http://127.0.0.1:9108/metrics"), ("0.0.0.0", "http://127.0.0.1:9108/metrics"),
    ("10.0.0.5", "http://10.0.0.5:9108/metrics"), ("::", "http://[::1]:9108/metrics"),
    ("fd00::5", "http://[fd00::5]:9108/metrics")])
def test_the_metrics_endpoint_is_read_where_it_listens(host, url):
    assert build_config({"metrics": {"host": host}}).metrics.url == url
    assert build_config({"metrics": {"host": host, "port": 0}}).metrics.url is None


def test_the_metrics_endpoint_listens_on_the_loopback_unless_set():
    assert build_config({}).metrics.host == "127.0.0.1"
    with pytest.raises(ConfigError, match="metrics.host"):
        build_config({"metrics": {"host": ""}})


@pytest.mark.parametrize("name, section, renamed", [
    ("mailbox", {"messages_table": "msgs", "payload_refs_table": "refs", "payloads_table": "blobs"},
     {"messages": "msgs", "payload_refs": "refs", "payloads": "blobs"}),
    ("rule_events", {"table": "routing_events"}, {"rule_events": "routing_events"}),
    ("users", {"users_table": "u", "virtual_roots_table": "roots", "permissions_table": "perms"},
     {"users": "u", "virtual_roots": "roots", "mailbox_permissions": "perms"}),
    ("units_of_work", {"units_table": "uow", "objects_table": "objs"},
     {"units_of_work": "uow", "uow_objects": "objs"}),
])
def test_the_tables_setup_checks_are_the_configured_ones(name, section, renamed):
    from purger.policies import load_policy

    policy = load_policy(name, {"enabled": True, **section})
    scanned = {s.table: set(s.columns) for s in policy.scanned}
    # The column whose write time dates an orphan row.
    for orphans in policy.orphan_rows:
        scanned.setdefault(orphans.table, set()).update({orphans.written} - {None})
    # The columns an erasure finds a subject's objects by.
    for rows in policy.subjects:
        scanned.setdefault(rows.table, set()).update({rows.id_column, rows.subject_column})
    assert policy.columns_read() == {renamed[table]: frozenset({*columns, *scanned.get(table, ())})
                                     for table, columns in policy.tables.items()}
    # What reconciliation scans is checked too, the orphan rows' keys and their parents' included.
    assert all(set(s.columns) <= policy.columns_read()[renamed[s.table]] for s in policy.scanned)
    assert all(set(o.key) <= policy.columns_read()[renamed[o.table]]
               and o.parent_key in policy.columns_read()[renamed[o.parent]] for o in policy.orphan_rows)


def test_a_quiet_clock_faster_than_the_clock_is_refused_in_one_line():
    with pytest.raises(ConfigError) as error:
        build_config({"stream": {"clock_interval": "5s", "quiet_clock_interval": "2s"}})
    assert "stream.quiet_clock_interval (2s) is shorter than stream.clock_interval (5s)" in str(error.value)
