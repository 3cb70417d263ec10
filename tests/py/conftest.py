import pytest

import dtcore


@pytest.fixture
def fresh_dtcore():
    """dtcore in this process, shut down after the test whatever happened."""
    dtcore.shutdown(barrier=False)
    yield dtcore
    dtcore.shutdown(barrier=False)
