"""The trimq broker: a RocketMQ-compatible message broker on trio (DESIGN.md §3–5)."""
