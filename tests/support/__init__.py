"""Helpers shared by the tests: configurations, waits, fault injection, and the mailbox platform's cases."""
