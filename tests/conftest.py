"""Every test's profile cache is the session's own (`profile.cache`): a test never reads what
an earlier session traced with other code, and nothing is written to the user's ~/.cache."""
import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory):
    os.environ["SHARDSCHED_CACHE"] = str(tmp_path_factory.mktemp("shardsched-cache"))
    yield
