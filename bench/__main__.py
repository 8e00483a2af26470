"""Run every benchmark table, one after another, in one process."""

import importlib

MODULES = [
    "bench.drafter",  # drafter round latency: batched vs sequential requests
    "bench.verify",  # verifier cost by q encoding vs one log-softmax pass
    "bench.wire",  # wire bytes, encode+decode and loopback round trip: SPARSE vs DENSE
]

for name in MODULES:
    importlib.import_module(name).main()
