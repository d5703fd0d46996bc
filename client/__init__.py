"""trimq client libraries on anyio (DESIGN.md §6)."""
