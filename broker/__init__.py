"""The trimq broker: a RocketMQ-compatible message broker on trio (docs/design.md §3–5)."""
