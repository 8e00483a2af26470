"""The drafter worker: a local draft model served over the probability wire."""
