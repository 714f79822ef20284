"""Serving: the analyzer, child processes, path redaction, scheduling, caches, the timeline store and the Dask backend."""
