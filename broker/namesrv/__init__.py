"""The trimq name server (DESIGN.md §7)."""
