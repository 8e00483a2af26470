from pathlib import Path

import pytest

from specpair.models.tiny import TinyPair, make_tiny


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    """The default tiny pair (seed 0), generated once per session."""
    return make_tiny(Path(tmp_path_factory.mktemp("tiny")))
