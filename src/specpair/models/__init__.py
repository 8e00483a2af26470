"""Locally generated model pairs (no weight downloads): ``specpair models make-tiny``."""
