"""Pure, vectorised analyses over model.TraceData (one module per metric family).

Each function takes a TraceData (plus what it depends on, e.g. the steps) and returns
plain dicts/numbers in the report schema (docs/report-schema.md). No I/O here.
Each family also defines its metric unit (``UNIT``, units.py: compute / partial / finish /
card ids), listed in registry.py; report.py runs them. Nothing here imports judge/:
the cards are judged in judge/cards.py.
"""
