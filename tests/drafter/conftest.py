import pytest


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_torch_thread: None) -> None:
    """Every test here runs tiny models: one torch thread (see tests/conftest.py)."""
