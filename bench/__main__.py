"""Run every benchmark table, one after another, in one process."""

import importlib

MODULES = [
    "bench.drafter",  # drafter round latency: batched vs sequential requests
    "bench.verify",  # verifier cost by q encoding vs one log-softmax pass
    "bench.target_round",  # target-side round under V1: wire decode, q build, bookkeeping
    "bench.tp_share",  # what TP = 2 adds to a step: rank 0's answer shared, the guard
    "bench.wire",  # wire bytes, encode+decode and loopback round trip: SPARSE vs DENSE
    "bench.limits",  # two targets on one drafter (fairness); memory of 3000 held requests
    "bench.models",  # decode step of the trained pair: target vs draft
]

for name in MODULES:
    importlib.import_module(name).main()
