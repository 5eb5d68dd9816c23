"""Helpers that make real artefacts for tests, benchmarks and the local playground."""
