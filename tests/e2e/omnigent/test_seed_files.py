"""The seed files in this folder are the seeds, byte for byte, except `_server_entrypoint`.

`../shared/seeds/<name>.txt` starts with one header line naming the file's
path in the original repository, then a blank line, then the file. The port
keeps the file and replaces only the body of `_server_entrypoint()` (it
starts `omnigent server --runners 0` instead of the original's internals).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
SEEDS = Path(os.environ.get("OMNIGENT_SEEDS_DIR", _HERE.parents[3] / "shared" / "seeds"))
ALLOWED = {"test_repl_session_lifecycle.py": {"_server_entrypoint"}}


def _seed_text(name: str) -> str:
    path = SEEDS / f"{name}.txt"
    if not path.is_file():
        pytest.skip(f"seed file not found: {path} (set OMNIGENT_SEEDS_DIR)")
    header, body = path.read_text(encoding="utf-8").split("\n\n", 1)
    assert header.endswith(f"/{name}") and "\n" not in header, header
    return body


def _without(text: str, names: set[str]) -> tuple[str, dict[str, str]]:
    """`text` with the top-level functions `names` cut out (marked), and those functions' sources."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    cut: dict[str, str] = {}
    for node in sorted(tree.body, key=lambda n: n.lineno, reverse=True):
        if isinstance(node, ast.FunctionDef) and node.name in names:
            first = node.lineno - 1 - len(node.decorator_list)
            cut[node.name] = "".join(lines[first:node.end_lineno])
            lines[first:node.end_lineno] = [f"<{node.name}>\n"]
    return "".join(lines), cut


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_port_differs_from_the_seed_only_in_the_allowed_functions(name: str) -> None:
    seed = _seed_text(name)
    port = (_HERE / name).read_text(encoding="utf-8")
    seed_rest, seed_cut = _without(seed, ALLOWED[name])
    port_rest, port_cut = _without(port, ALLOWED[name])
    assert set(seed_cut) == set(port_cut) == ALLOWED[name]
    assert port_rest == seed_rest


def test_ported_server_entrypoint_starts_omnigent_server() -> None:
    port = (_HERE / "test_repl_session_lifecycle.py").read_text(encoding="utf-8")
    _, cut = _without(port, {"_server_entrypoint"})
    source = cut["_server_entrypoint"]
    assert '"server"' in source and '"--runners",\n    "0"' in source
    assert "OMNIGENT_E2E_PORT" in source and "OMNIGENT_E2E_DB_URI" in source
