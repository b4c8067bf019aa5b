"""The streaming job: Kafka source, event parsing, state and timers, the query."""
