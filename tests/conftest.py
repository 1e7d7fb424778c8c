"""Suite-wide fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_orphan_sandboxes():
    """Tests that used the python tool on a short-lived event loop leave no interpreter."""
    yield
    from agentrl.tools.python import kill_orphaned_sandboxes

    kill_orphaned_sandboxes()
