"""The purger application: configuration, command line, local stack and demo workload."""

# The product's packages: what `purger submit` ships to the executors, and whose loggers --log-level sets.
PACKAGES = ("core", "connectors", "policies", "purger", "streams", "sinks")
