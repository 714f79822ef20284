"""Storage, discovery and loading: from a logdir to typed columns (TraceData)."""
