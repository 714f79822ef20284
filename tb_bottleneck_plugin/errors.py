"""Typed errors. Every message names the file (or URL) and what is wrong with it."""
from __future__ import annotations


class BottleneckError(Exception):
    """Base class: an expected problem that the UI, API and CLI show as a message."""


class TraceError(BottleneckError):
    """A trace file that cannot be used. ``path`` names it, ``problem`` says why."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class NotATraceError(TraceError):
    """Valid JSON (or an unrelated file) that is not a PyTorch/Kineto trace."""


class TruncatedTraceError(TraceError):
    """The file ends early: an unfinished write, a broken download, a cut gzip stream.

    Live logdirs retry these later instead of reporting them as broken for ever.
    """


class StorageError(BottleneckError):
    """A logdir or file that cannot be listed or read (missing, permission, network)."""


class MissingExtraError(StorageError):
    """An fsspec protocol whose package is not installed (gs:// needs gcsfs)."""
