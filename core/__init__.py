"""The pure core: events, states, rules, schedules, the policy interface and the writer contract's quorum
arithmetic. No Spark, no driver, no network. Its only I/O: ``config`` reads the configuration file and the
``PURGER_*`` environment variables. ``failpoints`` names the moments where a test's hooks (``purger.testing``)
may act, and installs none."""
