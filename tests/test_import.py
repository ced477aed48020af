"""`import ram_live` pulls in none of the optional extras."""

import subprocess
import sys

EXTRAS = ["peft", "transformers", "lightning", "pytorch_lightning", "verl", "matplotlib", "mergekit"]


def test_import_imports_no_extra():
    code = (
        "import sys, ram_live, ram_live.integrations\n"
        f"loaded = [m for m in {EXTRAS!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "ram_live.probe([{'w': __import__('torch').ones(2)}], base={'w': __import__('torch').zeros(2)}).table()\n"
        f"assert not [m for m in {EXTRAS!r} if m in sys.modules]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
