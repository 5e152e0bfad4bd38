"""Stage 5, analysts: the DuckDB catalog, read-only access, nearest-neighbour search, terminal tables."""
