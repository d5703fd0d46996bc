"""PySpark analysis of trimq's latency events (DESIGN.md §8)."""
