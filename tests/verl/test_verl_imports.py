"""The verl package imports nothing heavy until a name is used (``ram-live verl-snapshot --help`` needs only
argparse); every public name still resolves. No verl needed."""

from __future__ import annotations

import subprocess
import sys

NAMES = [
    "ActorCheckpoint",
    "RAMTrainerMixin",
    "RAMVerl",
    "RAMVerlHooks",
    "RAMVerlOptions",
    "VerlIntegrationError",
    "find_checkpoints",
    "main",
    "options_from_mapping",
    "options_from_verl",
]


def test_package_and_cli_import_no_torch():
    code = (
        "import sys, ram_live.integrations.verl as v, ram_live.integrations.verl.cli as c\n"
        "c.build_parser()\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
        "v.RAMVerl\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_answers_without_torch():
    code = (
        "import sys, runpy\n"
        "sys.argv = ['ram-live', 'verl-snapshot', '--help']\n"
        "try:\n"
        "    runpy.run_module('ram_live', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "assert 'torch' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "--ckpt-root" in out


def test_every_public_name_resolves():
    import ram_live.integrations.verl as v
    from ram_live.integrations.verl.common import VerlIntegrationError
    from ram_live.integrations.verl.core import RAMVerl

    assert sorted(NAMES + ["RAMCheckpointCallback"]) == sorted(v.__all__)
    for name in NAMES:
        assert getattr(v, name).__name__ == name
    assert v.RAMVerl is RAMVerl and v.VerlIntegrationError is VerlIntegrationError


def _relative_imports(path) -> set[str]:
    """The sibling modules ``path`` imports (``from .x import ...``), at the top or inside functions."""
    import ast

    tree = ast.parse(path.read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}


def test_the_package_has_no_import_circle():
    """No module of integrations/verl reaches itself through its sibling imports (lazy ones included): ``config``
    and ``rewards`` share :mod:`.dotted` instead of importing each other."""
    from pathlib import Path

    import ram_live.integrations.verl as v

    folder = Path(v.__file__).parent
    graph = {p.stem: _relative_imports(p) for p in folder.glob("*.py")}
    assert "config" not in graph["rewards"] and "dotted" in graph["rewards"]
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            assert name != start, f"import circle through {start}"
            if name not in seen:
                seen.add(name)
                todo.extend(graph.get(name, ()))
    from ram_live.integrations.verl import config, dotted, rewards

    assert config.get_dotted is dotted.get_dotted and rewards.get_dotted is dotted.get_dotted
