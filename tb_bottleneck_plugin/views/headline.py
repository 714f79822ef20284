"""The headline numbers and cards, derived from the metric units (analysis/units.py
``Metric`` / ``Card``, declared once in each unit's ``Unit.metrics``): compare's rows
(views/compare.py ``HEADLINE``), the gate's metric names (views/gate.py), the plain lines of
``tb-bottlenecks report`` (views/text_report.py) and the dashboard's card list (the ``cards``
block of the ``/runs`` answer, read by static/cards.js).

Read at call time from ``registry.UNITS``, so a unit added to the registry is in all of
them. Headline numbers that are no one unit's (derived from several, or from an input such
as the batch size) are declared here, in the same ``Metric`` type.
"""
from __future__ import annotations

from typing import List

from ..analysis import registry
from ..analysis.units import HIGHER, Card, Metric

# Derived numbers (no one unit's): throughput needs the batch size, which no trace records
# (compare.headline_value computes it; its getter is None).
DERIVED = (
    Metric("throughput_samples_per_s", "Throughput", "samples/s", HIGHER, None, (), text=False, order=10),
)

# a card's `unit` word for formatting a value without a verdict (docs/route-schema.json `verdict.unit`)
_CARD_UNITS = {"%": "pct", "bytes": "bytes", "us": "us"}


def metrics() -> List[Metric]:
    """Every headline number, in headline order (``Metric.order``; registry order within an order)."""
    found = [m for unit in registry.UNITS for m in unit.metrics] + list(DERIVED)
    return sorted(found, key=lambda m: m.order)


def card_list() -> List[dict]:
    """The dashboard's headline cards, in card order (``Card.order``), as JSON: ``{id, label,
    unit, metric, explain, field, sublabel, definition, amd_label, amd_explain, optional}``.
    static/cards.js renders one card per entry with the server's ``report.verdicts[id]``."""
    pairs = sorted(((m.card, m) for m in metrics() if m.card is not None), key=lambda p: p[0].order)
    out = []
    for card, m in pairs:
        out.append({"id": card.id, "label": card.label, "unit": _CARD_UNITS.get(m.unit, "count"), "metric": m.key,
                    "explain": card.explain, "field": list(card.field) if card.field else None,
                    "sublabel": card.sublabel, "definition": card.definition, "amd_label": card.amd_label,
                    "amd_explain": card.amd_explain, "optional": card.optional})
    return out


__all__ = ["Card", "DERIVED", "Metric", "card_list", "metrics"]
