"""Admission gates: checks that must pass before a measurement (every failure is a STOP)."""
