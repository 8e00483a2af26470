"""The core's errors: one class per failure, all under SpecpairError.

Every SpecpairError carries the exit code the command line gives it (docs/cli.md):
``specpair.cli.main`` prints ``specpair COMMAND: message`` on one line and exits with it.
"""

from __future__ import annotations

__all__ = [
    "EXIT_OK", "EXIT_FAILED", "EXIT_WARN", "EXIT_CANNOT_RUN", "EXIT_BAD_INPUT",
    "EXIT_BUSY", "EXIT_INTERRUPTED", "SpecpairError", "BadInput", "CannotRun", "InvalidProposal",
    "MissingDraftLaw", "IllegalPointMass", "BadSamplingParams",
]

# The exit codes of every `specpair` command (docs/cli.md; each command names the ones it uses).
EXIT_OK = 0  # done, passed, qualified
EXIT_FAILED = 1  # a check ran and failed (health fail, gate fail, NOT QUALIFIED, play failed)
EXIT_WARN = 2  # neither pass nor fail: health warn, a gate whose must-fail control passed
EXIT_CANNOT_RUN = 3  # this host lacks what the command needs (no NVML, no Docker engine)
EXIT_BAD_INPUT = 4  # bad arguments or input files (usage errors included), refused up front
EXIT_BUSY = 6  # another run holds the deploy lock (deploy/rollback/restore/gates)
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C), or SIGTERM to a deploy/rollback/restore/gates run


class SpecpairError(Exception):
    """Base of every error specpair raises on purpose."""

    exit_code = EXIT_BAD_INPUT  # what `specpair` exits with when this reaches the top


class BadInput(SpecpairError, ValueError):
    """A command-line argument is out of its documented range."""


class CannotRun(SpecpairError):
    """This host lacks what the command needs (a driver, a device, an engine)."""

    exit_code = EXIT_CANNOT_RUN


class InvalidProposal(SpecpairError, ValueError):
    """A proposal's tensors have the wrong shape, dtype or contents."""


class MissingDraftLaw(SpecpairError):
    """A proposal lacks q for some request and the caller asked to refuse it."""


class IllegalPointMass(SpecpairError):
    """Point-mass q was requested for drafts that were not declared greedy."""


class BadSamplingParams(SpecpairError, ValueError):
    """Sampling parameters outside their documented domain (docs/core.md)."""
