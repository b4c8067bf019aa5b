"""The pure core: events, states, rules, schedules, the policy interface and the writer contract's quorum
arithmetic. No Spark, no driver, no network. Its only I/O: ``config`` reads the configuration file and the
``PURGER_*`` environment variables; ``failpoints``, for the fault tests and only when ``PURGER_FAILPOINT``
names a failpoint, creates a marker file and kills the process group."""
