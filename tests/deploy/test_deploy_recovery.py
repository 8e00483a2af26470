"""Deploy as a transaction (issue 16, items 2 and 5) on real Docker with the stand-in pair
(tests/deploy/standin.py): for EVERY kill point of a deploy (standin.POINTS: the intent
write, the old target's removal, the new drafter's and the new target's start, the commit
phase, the first host's record write), the whole process tree (the CLI, ansible-playbook and
its workers, each in its own session) is SIGKILLed there, then ONE deploy must converge: exit
0, every host records one release and runs it, the intent done, a `recovery:` line saying
forward or back and why.

Each point costs two deploys (3-4 minutes each on the loaded 2-core box), so this sweep runs
only with SPECPAIR_DEPLOY_KILL_SWEEP=1 (`make deploy-sweep`, not part of `make test`: it would take
CI past its hour); the default run takes one point
(the first record write: records that disagree) at the end of test_deploy_standin.py, on the
pair that module already deployed.
"""

from __future__ import annotations

import os

import pytest
from standin import POINTS, kill_then_deploy, make_standin

pytestmark = pytest.mark.skipif(
    os.environ.get("SPECPAIR_DEPLOY_KILL_SWEEP") != "1",
    reason="the kill sweep takes two deploys per point (about 45 minutes on a loaded 2-core "
    "box): SPECPAIR_DEPLOY_KILL_SWEEP=1 (make deploy-sweep) runs it; the default run takes one "
    "point in test_deploy_standin.py",
)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    yield from make_standin(tmp_path_factory)


@pytest.mark.parametrize("point", list(POINTS))
def test_a_kill_is_finished_by_the_next_deploy(standin, point):
    print(kill_then_deploy(standin, point))
