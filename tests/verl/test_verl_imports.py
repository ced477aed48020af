"""The verl package imports nothing heavy until a name is used (``ram-live verl-snapshot --help`` needs only
argparse); every public name still resolves. No verl needed."""

from __future__ import annotations

import subprocess
import sys

NAMES = ["ActorCheckpoint", "RAMTrainerMixin", "RAMVerl", "RAMVerlHooks", "RAMVerlOptions", "VerlIntegrationError",
         "find_checkpoints", "main", "options_from_mapping", "options_from_verl"]


def test_package_and_cli_import_no_torch():
    code = ("import sys, ram_live.integrations.verl as v, ram_live.integrations.verl.cli as c\n"
            "c.build_parser()\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
            "v.RAMVerl\n"
            "assert 'torch' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_answers_without_torch():
    code = ("import sys, runpy\n"
            "sys.argv = ['ram-live', 'verl-snapshot', '--help']\n"
            "try:\n"
            "    runpy.run_module('ram_live', run_name='__main__')\n"
            "except SystemExit as exc:\n"
            "    assert exc.code == 0, exc.code\n"
            "assert 'torch' not in sys.modules\n")
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
