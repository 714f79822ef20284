"""Judging: verdicts (cards) and recommendations from a report's numbers; every threshold lives in thresholds.py."""
