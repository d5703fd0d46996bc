"""PySpark analysis of trimq's latency events (docs/design.md §8)."""
