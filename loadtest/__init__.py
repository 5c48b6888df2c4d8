"""Locust load tests for the speculative-decoding server (see docs/loadtest.md)."""
