"""Secrets stay secret: a purger run on secured servers, with a password or key planted for each of Kafka
(SASL_SSL), Cassandra (login and TLS) and S3 (the stores and an s3a:// ledger), given through the
environment, is searched for every planted secret in its logs, its Spark UI (the environment page, the
jobs, the SQL plans, the streaming query), its ledger and checkpoint, and the command line of every
process on the machine."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from pyspark.sql import functions as F

from purger.connectors import s3_client
from purger.config import build_config
from purger.core.settings import ObjectStoreConfig, S3Endpoint
from devstack.stack import LocalStack, s3proxy_server
from simulation.mailbox import Platform
from purger.sinks.ledger import Ledger
from purger.sinks.purge import OUTCOME_SCHEMA
from tests.support.configs import free_port, own_config, write_config
from tests.support.faults import reliability
from tests.support.mailbox import deletable
from tests.support.waits import wait_for
from tests.support import ROOT


@pytest.fixture(scope="module")
def secured(config, secure_kafka_broker, secure_cassandra_node) -> Iterator[tuple]:
    """Kafka over SASL_SSL, Cassandra with a login over TLS, and an S3 store whose secret key is planted."""
    s3 = S3Endpoint(endpoint=f"http://127.0.0.1:{free_port()}", access_key="planted",
                    secret_key=f"s3-{secrets.token_hex(10)}")
    store_server = s3proxy_server(f"s3proxy-planted-{s3.endpoint.rsplit(':', 1)[1]}", s3)
    stack = LocalStack([store_server], log=lambda line: None)
    stack.start(store_server.name)
    try:
        yield secure_kafka_broker, secure_cassandra_node, s3
    finally:
        stack.stop(store_server.name)


def secured_config(config, tmp: Path, kafka, cassandra, s3: S3Endpoint):
    """The session's configuration moved onto the secured servers, ledger in an s3a:// bucket."""
    stores = {dc: ObjectStoreConfig(bucket=f"planted-{dc}", **dict(s3)) for dc in config.stores}
    moved = config.model_copy(update={
        "kafka": kafka.kafka_config("SCRAM-SHA-512", **{k: v for k, v in dict(config.kafka).items()
                                                        if k not in ("bootstrap_servers", "security")}),
        "cassandra": cassandra.client(keyspace=config.cassandra.keyspace),
        "stores": stores,
    })
    own = own_config(moved, tmp, "secrets")
    return own.model_copy(update={"ledger": own.ledger.model_copy(update={
        "path": f"s3a://planted-dc1/ledger-{tmp.name}/records",
        "report_path": f"s3a://planted-dc1/ledger-{tmp.name}/report", "s3": s3})})


def planted(own) -> dict[str, str]:
    return {"Kafka password": own.kafka.security.password.get_secret_value(),
            "Cassandra password": own.cassandra.password.get_secret_value(),
            "S3 secret key": own.ledger.s3.secret_key.get_secret_value()}


def command_lines() -> str:
    """Every process's command line, as `ps` would show it."""
    lines = []
    for entry in Path("/proc").iterdir():
        try:
            lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except (FileNotFoundError, NotADirectoryError, PermissionError, ProcessLookupError):
            continue
    return "\n".join(lines)


def spark_ui_pages(log: Path) -> str:
    """The Spark UI of the purger's process, at the port its "purger running" line names (other sessions' UIs
    answer on the ports near it, the other lane's among them): its REST API's environment, jobs, stages, SQL
    executions with their plans and streaming queries, and the HTML pages."""
    found = re.search(r"Spark UI https?://[^\s,/]+:(\d+)", log.read_text(errors="replace"))
    assert found, "the purger's log names no Spark UI"
    base = f"http://127.0.0.1:{found.group(1)}"
    # A busy JVM on 2 shared cores may take seconds to answer: a long timeout.
    with urllib.request.urlopen(f"{base}/api/v1/applications", timeout=60) as response:
        (application,) = json.load(response)
    api = f"{base}/api/v1/applications/{application['id']}"
    pages = [f"{api}/environment", f"{api}/jobs", f"{api}/stages", f"{api}/streaming/statistics",
             f"{api}/sql?details=true&planDescription=true", f"{base}/environment/", f"{base}/SQL/",
             f"{base}/jobs/", f"{base}/StreamingQuery/"]
    texts = []
    for page in pages:
        try:
            with urllib.request.urlopen(page, timeout=10) as response:
                texts.append(response.read().decode(errors="replace"))
        except urllib.error.HTTPError as error:  # a page this version does not serve
            texts.append(f"{page}: {error.code}")
    assert any('"spark.app.id"' in text or "spark.app.id" in text for text in texts), "no environment page"
    return "\n".join(texts)


@pytest.mark.integration
def test_planted_secrets_reach_no_log_ui_page_ledger_or_command_line(spark, config, secured, tmp_path_factory):
    kafka, cassandra, s3 = secured
    tmp = tmp_path_factory.mktemp("secrets")
    own = secured_config(config, tmp, kafka, cassandra, s3)
    own = own.model_copy(update={"metrics": own.metrics.model_copy(update={"port": 0})})
    secret = planted(own)
    # The file names the servers and logins; the secrets come from the environment only.
    config_file = write_config(own, tmp / "purger.toml", secrets=False)
    assert not [name for name, value in secret.items() if value in config_file.read_text()]
    environment = {**os.environ, "PURGER_KAFKA_PASSWORD": secret["Kafka password"],
                   "PURGER_CASSANDRA_PASSWORD": secret["Cassandra password"],
                   "PURGER_S3_SECRET_KEY": secret["S3 secret key"]}

    platform = Platform(own)
    log = tmp / "purger.log"
    seen: dict[str, str] = {}
    try:
        messages = deletable(platform, own, 5, "secrets")
        with log.open("wb") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "purger.job", "--config", str(config_file), "--log-level", "DEBUG"],
                cwd=ROOT, env=environment, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(lambda: all(platform.row(m) is None and platform.payload_gone(f"p-{m}") for m in messages)
                     or process.poll() is not None, timeout_s=300, what="the purge on the secured servers")
            assert process.poll() is None, f"the purger ended ({process.returncode}):\n{log.read_text()[-3000:]}"
            seen["command lines"] = command_lines()
            seen["Spark UI"] = spark_ui_pages(log)
        finally:
            process.terminate()
            try:
                process.wait(timeout=120)
            finally:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    finally:
        platform.close()

    seen["logs"] = log.read_text(errors="replace")
    records = Ledger(spark, own.ledger).records()
    assert records.where(F.col("status") == "purged").count() == 5 * len(messages)  # row, reference, payload, 2 blobs
    seen["ledger"] = "\n".join(str(row.asDict()) for row in records.collect())
    seen["checkpoint"] = "\n".join(path.read_text(errors="replace")
                                   for path in Path(own.stream.checkpoint_location).rglob("*")
                                   if path.is_file() and path.stat().st_size < 1 << 20)
    found = {(name, place) for name, value in secret.items() for place, text in seen.items() if value in text}
    reliability("planted secrets", injected=len(secret), places=len(seen),
                **{f"found_in_{place.replace(' ', '_')}": sum(1 for _, p in found if p == place) for place in seen})
    assert found == set(), found
    # The search could find them: the run did log in with each.
    assert "batch" in seen["logs"] and seen["Spark UI"]


def test_credentials_come_from_the_environment_and_stay_masked(monkeypatch):
    monkeypatch.setenv("PURGER_KAFKA_USERNAME", "purger")
    monkeypatch.setenv("PURGER_KAFKA_PASSWORD", "kafka-from-env")
    monkeypatch.setenv("PURGER_CASSANDRA_USERNAME", "purger")
    monkeypatch.setenv("PURGER_CASSANDRA_PASSWORD", "cassandra-from-env")
    monkeypatch.setenv("PURGER_S3_SECRET_KEY", "s3-from-env")
    config = build_config({"kafka": {"security": {"protocol": "SASL_SSL"}}})
    assert config.kafka.security.password.get_secret_value() == "kafka-from-env"
    assert config.cassandra.password.get_secret_value() == "cassandra-from-env"
    assert {store.secret_key.get_secret_value() for store in config.stores.values()} == {"s3-from-env"}
    assert config.ledger.s3.secret_key.get_secret_value() == "s3-from-env"
    shown = f"{config!r} {config} {config.model_dump_json()} {config.model_dump()}"
    assert not [secret for secret in ("kafka-from-env", "cassandra-from-env", "s3-from-env") if secret in shown]


@pytest.mark.integration
def test_the_aws_credential_chain_reaches_the_stores_and_the_s3a_ledger(spark, config, monkeypatch, tmp_path):
    """With ``credentials = "aws"``, the keys come from the AWS chain: boto3's (the AWS_* variables here) for
    the stores, the AWS SDK's (its system properties here, first in its chain) for the s3a:// ledger."""
    store = config.stores["dc1"]
    bucket = f"aws-chain-{secrets.token_hex(4)}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", store.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", store.secret_key.get_secret_value())
    chained = ObjectStoreConfig(endpoint=store.endpoint, bucket=bucket, credentials="aws", access_key="unused",
                                secret_key="unused")
    s3_client(chained).create_bucket(Bucket=bucket)
    assert bucket in {b["Name"] for b in s3_client(chained).list_buckets()["Buckets"]}

    system = spark.sparkContext._jvm.java.lang.System
    system.setProperty("aws.accessKeyId", store.access_key)
    system.setProperty("aws.secretAccessKey", store.secret_key.get_secret_value())
    try:
        ledger_config = config.ledger.model_copy(update={
            "path": f"s3a://{bucket}/records",
            "s3": S3Endpoint(endpoint=store.endpoint, credentials="aws")})
        ledger = Ledger(spark, ledger_config)
        at = int(time.time() * 1000)
        ledger.append(spark.createDataFrame(
            [("mailbox", "message", "m1", "deleted", None, "purged", None, at, at, at, 0, "host:1", None)], OUTCOME_SCHEMA),
            "aws-chain", 0)
        assert ledger.records().count() == 1
    finally:
        system.clearProperty("aws.accessKeyId")
        system.clearProperty("aws.secretAccessKey")
        spark.conf.unset("fs.s3a.aws.credentials.provider")
