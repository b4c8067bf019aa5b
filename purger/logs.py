"""The purger's logs: its own lines at a chosen level, Spark's warnings without their per-key noise.

Spark's JVMs log through ``log4j2.properties`` beside this module (``log4j2_options``: the driver's,
and the executors' under spark-submit); ``--log-level`` of ``purger run``, ``replay`` and ``submit``
sets the level of the purger's Python loggers and, at WARN or above, Spark's on the driver.

Example::

    log_to_stderr(LogLevel.INFO)            # before Spark starts
    spark = spark_session(config.stream)    # its JVM reads log4j2_options()
    set_spark_log_level(spark, LogLevel.INFO)
"""

from __future__ import annotations

import logging
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J2_CONFIGURATION = Path(__file__).with_name("log4j2.properties")
# The same layout as the JVM's (log4j2.properties), so the two read as one log.
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_DATE_FORMAT = "%y/%m/%d %H:%M:%S"


class LogLevel(str, Enum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


def log4j2_options(level: str = "warn") -> dict[str, str]:
    """Spark settings that make its JVMs read the purger's Log4j 2 configuration, with Spark's own loggers
    at ``level`` (``spark_level``) from the JVM's start: so a command that wants only errors sees none of
    the start's warnings. They apply when a JVM starts, so only to a session created with them (or a
    spark-submit given them); an executor on another machine needs the file at the same path."""
    option = f"-Dlog4j2.configurationFile={LOG4J2_CONFIGURATION.resolve().as_uri()} -Dpurger.spark.level={level}"
    return {"spark.driver.extraJavaOptions": option, "spark.executor.extraJavaOptions": option}


def spark_level(level: LogLevel) -> str:
    """Spark's level for the purger's ``level``: WARN, or ``level`` when it is higher (Spark's INFO is a
    dozen lines per micro-batch)."""
    severity = max(logging.getLevelName(level.value), logging.WARNING)
    return "WARN" if severity == logging.WARNING else logging.getLevelName(severity)


def log_to_stderr(level: LogLevel) -> None:
    """The purger's loggers (its packages') at ``level`` on stderr; other Python libraries' warnings only."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("purger").setLevel(level.value)


def set_spark_log_level(spark: SparkSession, level: LogLevel) -> None:
    """Spark's level on the driver: ``level`` when it is WARNING or above, else WARN (Spark's INFO is a
    dozen lines per micro-batch). The loggers that ``log4j2.properties`` names keep their own levels."""
    spark.sparkContext.setLogLevel(spark_level(level))
