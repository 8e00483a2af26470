"""What a playbook run's outcome means for the operator: whether it failed even though its
play exited 0, what to run next, and the exit code (releases/README.md, "Exit codes").

A move (deploy, rollback, restore) succeeds only when its summary says the pair is consistent
(restore: also restored): Ansible's exit status alone would call a play that ran to its end on
a restart-looping pair a success.
"""

from __future__ import annotations

import dataclasses

from specpair.deploy.report import health_summary
from specpair.deploy.runner import RunResult
from specpair.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK

__all__ = ["judge", "next_step", "exit_code"]

_MOVES = ("deploy", "rollback", "restore")


def judge(action: str, result: RunResult) -> RunResult:
    """The run as it is reported: `health`'s summary read from its reports; a move whose play
    exited 0 failed when its summary says the pair is not whole, with why."""
    if action == "health":
        return dataclasses.replace(result, summary=health_summary(result.run_dir))
    extra = _pair_failures(action, result) if result.rc == 0 else []
    if not extra:
        return result
    return dataclasses.replace(result, rc=1, status="failed", failures=[*result.failures, *extra])


def _pair_failures(action: str, result: RunResult) -> list[str]:
    """Why a move whose play exited 0 still failed: the summary's pair not whole."""
    s = result.summary
    if action not in _MOVES or not s or s.get("check_mode"):
        return []
    out = []
    if not s.get("pair_consistent"):
        bad = sorted(h for h, e in (s.get("hosts") or {}).items() if not e.get("matches_record"))
        out.append(f"pair consistent: NO after the play (hosts not running their recorded "
                   f"release healthy: {', '.join(bad) or 'none'}; recorded "
                   f"{s.get('recorded_release')})")
    if action == "restore" and not s.get("pair_restored"):
        why = ("no real completion was served through the pair" if s.get("completion") is None
               else "the pair is not whole" if not s.get("pair_consistent") else "a step failed")
        out.append(f"pair_restored is false: {why}")
    return out


def next_step(action: str, result: RunResult, inventory: str) -> str | None:
    """The command to run after a run that did not succeed (None after one that did)."""
    if result.rc == 0 and result.status != "canceled":
        return None
    s = result.summary or {}
    restore = f"specpair restore -i {inventory}"
    if result.status == "canceled":
        return (f"the run was stopped before it finished, the pair may be split: {restore} "
                "(puts the recorded release back on every host)")
    if action == "gates":
        return f"read the gate failures above; `specpair gates -i {inventory}` runs them again"
    if s and not s.get("pair_consistent"):
        return (f"{restore} (finishes the interrupted move, forward or back, then puts the "
                "recorded release back on every host: releases/README.md, 'Recovery')")
    if action == "restore":
        return f"fix the failure above, then {restore} again"
    return (f"the pair is whole on its recorded release; fix the failure above and run "
            f"{action} again")


def exit_code(result: RunResult) -> int:
    """130 for a run stopped by a signal, 0 for one that succeeded, else 1."""
    if result.status == "canceled":
        return EXIT_INTERRUPTED
    return EXIT_OK if result.rc == 0 else EXIT_FAILED
