"""Setup shared by the deploy tests."""

from __future__ import annotations

import pytest

# deploy_files.py checks what it reads with plain asserts, as a test would: have pytest show
# their operands on failure, as it does for the tests themselves.
pytest.register_assert_rewrite("tests.deploy.deploy_files")
