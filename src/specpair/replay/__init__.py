"""Offline replay: greedy vs sampled drafting on recorded target/draft distributions."""
