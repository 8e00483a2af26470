import os
from pathlib import Path

import pytest


@pytest.fixture
def overlaid_site() -> Path:
    """site-packages of this environment's vLLM, which must carry the specpair overlay.

    Skips with the reason where vLLM or the overlay is not installed, unless
    SPECPAIR_REQUIRE_OVERLAY=1 (set in the target image): there that is a failure.
    """
    from specpair.overlay.attestation import attestation_path
    from specpair.overlay.shadow_copy import installed_site

    site = installed_site()
    why = None
    if site is None:
        why = "vLLM is not installed in this environment"
    elif not attestation_path(site).is_file():
        why = f"the specpair overlay is not applied to this environment's vLLM ({site})"
    if why:
        if os.environ.get("SPECPAIR_REQUIRE_OVERLAY") == "1":
            pytest.fail(f"SPECPAIR_REQUIRE_OVERLAY=1 but {why}")
        pytest.skip(why)
    return site
