"""Run-level views built from the same partials, never re-reading traces: compare, ranks, the gate, terminal text and the HTML report."""
