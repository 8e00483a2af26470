"""Faults put into a tensor-parallel target, for the power checks of tests/e2e/test_tp2_pair.py.

Put this directory on the target's PYTHONPATH with SPECPAIR_TEST_TP_FAULT_FILE naming a file;
Python imports this module at start in every process of the engine (vLLM's workers included),
and every drafting step reads the file's phase:

- ``none``: nothing changes;
- ``before``: rank 1 receives rank 0's q a little off (log q + 0.3), before the guard's digest:
  the guard must see the disagreement, every rank drops the step's drafts, output exact;
- ``after-unchecked``: rank 1 verifies with q halved, after the guard's digest, and every rank
  ignores the appended-token check: the ranks diverge unseen, as they did before the drafting
  protocol shared rank 0's answer (the control the re-scoring check must fail);
- ``after``: the same perturbation with the appended-token check on: the engine must stop.

Nothing here runs without the variable; nothing of it ships (tests/ only).
"""

import os

_FILE = os.environ.get("SPECPAIR_TEST_TP_FAULT_FILE")


def _phase() -> str:
    try:
        with open(_FILE) as f:
            return f.read().strip() or "none"
    except OSError:
        return "none"


def _install() -> None:
    from specpair.qlaw import Drafts
    from specpair.vllm import drafting, v1

    class FaultyGroup:
        """The TP group with the fault of the current phase."""

        def __init__(self, group):
            self.group, self.rank, self.size = group, group.rank, group.size

        def share(self, obj):
            got = self.group.share(obj)
            if self.rank == 1 and _phase() == "before":
                got = {rid: d if d.q_logp is None else
                       Drafts(d.tokens, d.kind, d.q_logp + 0.3, d.q_ids)
                       for rid, d in got.items()}
            return got

        def agree(self, digests):
            same = self.group.agree(digests)
            return [True, *same[1:]] if _phase() == "after-unchecked" else same

    init = drafting.Drafting.__init__

    def faulty_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.group = FaultyGroup(self.group)

    write = v1.QRows.write

    def faulty_write(self, drafts):
        buf = write(self, drafts)
        if _phase().startswith("after") and drafting.tp_group().rank == 1:
            buf.mul_(0.5)  # zeros stay zeros: the next step's clearing is unchanged
        return buf

    drafting.Drafting.__init__ = faulty_init
    v1.QRows.write = faulty_write


if _FILE:
    _install()
