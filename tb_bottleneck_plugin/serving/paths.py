"""Paths as the browser sees them (`BrowserPaths`): relative to the logdir, so no route
answer carries a server path."""
from __future__ import annotations

import os
from typing import Optional, Tuple

from ..trace import discovery  # noqa: F401 - the type of BrowserPaths.learn's argument


class BrowserPaths:
    """Paths as the browser sees them: relative to the logdir. Server paths (the logdir's
    absolute location, a bucket's prefix) are not sent to the browser; the span results
    kept for it (`view`) and every message say ``run/worker.123.pt.trace.json``. The
    logdir itself, which TensorBoard already shows, is left as given. The CLI keeps full
    paths (it never goes through here)."""

    def __init__(self, logdir: str):
        # no storage call here (built on TensorBoard's thread); `learn` refines it per scan
        self._prefixes: Tuple[str, ...] = ()
        self._set(logdir if "://" in logdir else os.path.abspath(logdir), "")

    def _set(self, url: str, root: str) -> None:
        prefixes = {p.rstrip("/") + "/" for p in (url, root) if p and p.rstrip("/")}
        self._prefixes = tuple(sorted(prefixes, key=len, reverse=True))

    def learn(self, found: "discovery.Logdir") -> None:
        self._set(found.url, found.root)

    def relative(self, text: Optional[str]) -> Optional[str]:
        if not isinstance(text, str):
            return text
        for prefix in self._prefixes:
            if prefix in text:
                text = text.replace(prefix, "")
        return text

    def view(self, value):
        """A copy of a JSON value with every string made relative (dict keys too)."""
        if isinstance(value, str):
            return self.relative(value)
        if isinstance(value, dict):
            return {self.relative(k) if isinstance(k, str) else k: self.view(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.view(v) for v in value]
        return value
