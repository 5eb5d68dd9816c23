"""The simulator's development-only companions (the load generator the benchmark and tests drive)."""
