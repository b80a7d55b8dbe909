"""Every tutorial notebook runs real ORTModule bursts: slow tier (the fast tier is `pytest -m "not slow"`)."""

import pytest

from tests.conftest import pytest_runtest_protocol  # noqa: F401  (a stuck cell ends its worker, not the suite)


def pytest_collection_modifyitems(items):
    for item in items:
        if "notebooks" in item.path.parts and item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)
