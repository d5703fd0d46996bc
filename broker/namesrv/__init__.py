"""The trimq name server (docs/design.md §7)."""
