"""Java artifacts fetched with Maven and cached: Spark's connectors (Kafka, Delta, s3a), and the bundles
the developer tools' local servers use.

Each bundle is a set of Maven coordinates resolved with their runtime
dependencies into ``<home>/jars/<bundle>/``. A marker file records the
coordinates, so a second fetch downloads nothing and a change of version
fetches again.

Example::

    from purger.artifacts import SPARK_CONNECTORS, fetch
    jars = fetch(SPARK_CONNECTORS)  # list of jar paths
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


def purger_home() -> Path:
    """Where jars and the local stack live; outside the work tree so clean clones reuse them."""
    return Path(os.environ.get("PURGER_HOME", Path.home() / ".cache" / "purger"))


@dataclass(frozen=True)
class Bundle:
    name: str
    # group:artifact:version
    artifacts: tuple[str, ...]
    # Versions forced on transitive dependencies (group:artifact:version).
    pins: tuple[str, ...] = field(default_factory=tuple)
    # Transitive dependencies left out (group:artifact).
    exclusions: tuple[str, ...] = field(default_factory=tuple)

    @property
    def directory(self) -> Path:
        return purger_home() / "jars" / self.name

    def marker(self) -> str:
        return "\n".join(self.artifacts + self.pins + self.exclusions) + "\n"


SPARK_CONNECTORS = Bundle(
    "spark",
    (
        # The registry has no spark-sql-kafka 4.1.4; 4.1.3 is the same connector API.
        "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.3",
        # Delta's Spark-4.1 build; 4.4.1 jars are not published, 4.4.0 is the newest.
        "io.delta:delta-spark_4.1_2.13:4.4.0",
        # s3a:// for the ledger: the Hadoop version pyspark ships, with the AWS SDK modules it uses.
        "org.apache.hadoop:hadoop-aws:3.4.2",
        "software.amazon.awssdk:s3:2.29.52",
        "software.amazon.awssdk:s3-transfer-manager:2.29.52",
        "software.amazon.awssdk:sts:2.29.52",
    ),
    # spark-token-provider-kafka 4.1.x is not on the registry; 4.1.0-preview1 is the
    # nearest published build of the same classes.
    pins=("org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.1.0-preview1",),
    # The SDK's all-in-one bundle is half a gigabyte; the modules above are what s3a needs.
    exclusions=("software.amazon.awssdk:bundle",),
)


class FetchError(RuntimeError):
    pass


def _dependency(coordinates: str, exclusions: tuple[str, ...] = ()) -> str:
    group, artifact, version = coordinates.split(":")
    excluded = "".join(
        f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
        for g, a in (e.split(":") for e in exclusions)
    )
    return (
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version><exclusions>{excluded}</exclusions></dependency>"
    )


def _pom(bundle: Bundle) -> str:
    pins = "".join(_dependency(c) for c in bundle.pins)
    deps = "".join(_dependency(c, bundle.exclusions) for c in bundle.artifacts)
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>local.purger</groupId><artifactId>{bundle.name}</artifactId><version>1</version>"
        "<packaging>pom</packaging>"
        f"<dependencyManagement><dependencies>{pins}</dependencies></dependencyManagement>"
        f"<dependencies>{deps}</dependencies></project>"
    )


def fetch(bundle: Bundle) -> list[Path]:
    """Resolve the bundle with Maven unless it is cached; return its jars."""
    marker = bundle.directory / ".fetched"
    if not (marker.exists() and marker.read_text() == bundle.marker()):
        mvn = shutil.which("mvn")
        if mvn is None:
            raise FetchError("Maven (mvn) is not on PATH; install it, e.g. `apt-get install maven`")
        staging = bundle.directory.with_name(bundle.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        with tempfile.TemporaryDirectory() as work:
            (Path(work) / "pom.xml").write_text(_pom(bundle))
            result = subprocess.run(
                [mvn, "-B", "-q", "dependency:copy-dependencies", "-DincludeScope=runtime",
                 f"-DoutputDirectory={staging}"],
                cwd=work, capture_output=True, text=True,
            )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            raise FetchError(f"Maven could not fetch {', '.join(bundle.artifacts)}:\n{tail}")
        shutil.rmtree(bundle.directory, ignore_errors=True)
        staging.rename(bundle.directory)
        marker.write_text(bundle.marker())
    return sorted(bundle.directory.glob("*.jar"))


def _artifact_name(jar: Path) -> str:
    """``kafka-clients-3.9.1.jar`` -> ``kafka-clients``."""
    parts = jar.stem.split("-")
    while parts and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)


def spark_connector_jars() -> list[Path]:
    """The connector jars Spark lacks: those whose artifact is not already in pyspark's jars.

    Adding a second copy of a library pyspark ships (Hadoop, Jackson, Scala) would put two
    versions on one class path.
    """
    import pyspark

    shipped = {_artifact_name(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [jar for jar in fetch(SPARK_CONNECTORS) if _artifact_name(jar) not in shipped]
