"""The purger on servers that check their clients: a SASL_SSL Kafka broker and a Cassandra node with a login
and TLS, each a JVM of its own that runs while this package's tests do, and no longer."""
