"""The purger: a continuous purger on Spark Structured Streaming (see README.md and docs/).

The installed package holds the whole product: the pure core (``purger.core``: the policy interface,
configuration, times), the built-in policies (``purger.policies``), the stream up to the purge
candidates (``purger.streams``), the foreachBatch side (``purger.sinks``), the reconcile
(``purger.reconcile``), the clients of Kafka, Cassandra and S3 (``purger.connectors``), and the
application here (command line, job, replay, setup). Its list of packages is pyproject.toml's alone
(``purger.submit.product_packages`` finds them as installed).
"""

# The one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic), `purger --version`
# prints it, and CHANGELOG.md has a section for it.
__version__ = "0.2.0"
