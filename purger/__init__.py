"""The purger application: configuration, command line, local stack and demo workload."""
