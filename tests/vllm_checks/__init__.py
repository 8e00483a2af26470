"""Tools of the vLLM-level tests and gates (e2e, the in-image sampling gate, V2 on GPU).

``probe.py`` runs a vLLM in a subprocess and prints a JSON report; ``twosample.py``
is the two-sample chi-square those tests compare samplers with. They live under
tests/ (importable as ``vllm_checks``: tests/conftest.py puts tests/ on sys.path)
because only tests use them; the target image carries tests/, so its gates find them.
"""
