"""The pure core: events, states, rules, schedules and the policy interface. No Spark, no I/O."""
