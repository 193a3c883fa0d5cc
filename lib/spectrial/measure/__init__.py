"""Measuring a server: the benchmark client (`bench`), the workloads it sends, /metrics scrapes, and every HTTP read bounded (`httpread`)."""
