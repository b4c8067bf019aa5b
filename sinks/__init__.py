"""foreachBatch sinks: Cassandra double-checked deletes and per-data-centre object stores."""
