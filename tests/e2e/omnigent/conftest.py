"""What the seed files in this folder import from `tests.e2e.omnigent.conftest`.

The fixtures themselves (`omnigent_python`, `omnigent_repo_root`,
`mock_llm_server_url`, `mock_credentials_env`) live in `tests/conftest.py`
and are shared with every test; this module only re-exports the mock LLM
helpers under the seeds' import path, and skips the seed tests whose
feature is not built yet (the seed bodies stay byte-identical).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import configure_mock_llm, reset_mock_llm

__all__ = ["configure_mock_llm", "reset_mock_llm"]

_HERE = Path(__file__).resolve().parent

# seed test -> why it cannot run yet (issue 8 §1 and §3)
NOT_BUILT: dict[str, str] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent != _HERE:
            continue
        reason = NOT_BUILT.get(f"{item.path.name}::{item.name}")
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
