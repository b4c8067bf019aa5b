"""Benchmark scripts: each prints its figures and appends them to bench/results.jsonl (BENCHMARKS.md)."""
