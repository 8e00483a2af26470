"""Run every benchmark table, one after another, in one process."""

import importlib

MODULES = [
    "bench.drafter",  # drafter round latency: batched vs sequential requests
    "bench.verify",  # verifier cost by q encoding vs one log-softmax pass
]

for name in MODULES:
    importlib.import_module(name).main()
