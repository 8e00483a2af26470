"""`specpair gate ...`: run a gate and report (human table or --json)."""

from __future__ import annotations

import argparse
import json

from specpair.errors import EXIT_FAILED, EXIT_OK, EXIT_WARN, BadInput
from specpair.gates.rng_gate import ALPHA, CONFIGS, GateReport, run_gate

EXIT = {"PASS": EXIT_OK, "FAIL": EXIT_FAILED, "BROKEN": EXIT_WARN}


def add_parser(sub: argparse._SubParsersAction) -> None:
    gate = sub.add_parser("gate", help="run a statistical gate",
                          description="Statistical gates that must pass before serving.")
    gsub = gate.add_subparsers(dest="gate", metavar="GATE", required=True)
    rng = gsub.add_parser(
        "rng", help="verifier-RNG gate: real speculator + verifier, with a must-fail control",
        description="Run the REAL sampled speculator and reference verifier on the registered "
        "stress configurations; chi-square of the emitted tokens at every position and a "
        "binomial test of the acceptance rate against sum(min(p, q)), at alpha/m. The control "
        "(recovery noise coupled to the draft stream) must fail. Exit 0: every check passed and "
        "the control failed; 1: a check failed; 2: the control passed (the gate is broken); "
        "4: bad arguments.",
    )
    rng.add_argument("--json", action="store_true", help="print the full report as JSON")
    rng.add_argument("--size", choices=["quick", "full"], default="full",
                     help="sample sizes: full (default, the in-image gate) or quick (tests)")
    rng.add_argument("--alpha", type=float, default=ALPHA,
                     help=f"family-wise false-failure rate, in (0, 1) (default {ALPHA:g})")
    rng.add_argument("--config", action="append", metavar="NAME",
                     help="run only this registered configuration (repeatable; the control "
                     "configuration is always added)")
    rng.add_argument("--list", action="store_true", help="list the registered configurations")
    rng.set_defaults(func=_run_rng)


def _run_rng(args: argparse.Namespace) -> int:
    if not 0 < args.alpha < 1:  # False for NaN
        raise BadInput(f"--alpha must lie in (0, 1), got {args.alpha}")
    unknown = sorted(set(args.config or ()) - {c.name for c in CONFIGS})
    if unknown:
        raise BadInput(f"--config: unknown configuration(s) {unknown}; `specpair gate rng "
                       "--list` names them")
    if args.list:
        for c in CONFIGS:
            print(f"{c.name:34s} V={c.vocab:<7d} K={c.depth} T={c.temperature} "
                  f"trials quick/full={c.trials[0]}/{c.trials[1]}"
                  f"{' +control' if c.control else ''}")
        return 0
    report = run_gate(args.size, args.config, args.alpha, progress=not args.json)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_table(report)
    return EXIT[report.status]


def _print_table(report: GateReport) -> None:
    print(f"{'config':34s} {'check':10s} {'pos':>3s} {'n':>7s} {'df':>4s} {'chi2':>9s} "
          f"{'thresh':>8s} {'acc':>6s} {'expect':>6s}  ok")
    for label, checks in (("", report.checks), ("CONTROL ", report.control)):
        for c in checks:
            print(f"{label + c.config:34s} {c.kind:10s} {c.position:3d} {c.n:7d} "
                  f"{_f(c.df, 'd'):>4s} {_f(c.chi2, '.1f'):>9s} {_f(c.threshold, '.1f'):>8s} "
                  f"{_f(c.acceptance, '.3f'):>6s} {_f(c.expected_acceptance, '.3f'):>6s}  "
                  f"{'yes' if c.passed else 'NO'}")
    print(f"\nalpha={report.alpha:g} m={report.m} size={report.size}: "
          f"{sum(c.passed for c in report.checks)}/{len(report.checks)} checks passed; "
          f"control {'FAILED as it must' if report.control_failed else 'PASSED: gate broken'}"
          f" -> {report.status}")


def _f(v: float | int | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)
