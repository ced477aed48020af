"""`import ram_live` pulls in none of the optional extras, nor torch (its exports load on first use), and every
public name imports."""

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


def test_every_public_name_imports_lazily():
    code = (
        "import sys, ram_live\n"
        "assert 'torch' not in sys.modules\n"
        "import ram_live.probe, ram_live.search.run\n"  # importing the submodules keeps the functions
        "assert callable(ram_live.probe) and callable(ram_live.search)\n"
        "from ram_live import *\n"
        "missing = [n for n in ram_live.__all__ if n not in globals()]\n"
        "assert not missing, missing\n"
        "assert set(ram_live.__all__) <= set(dir(ram_live))\n"
        "from ram_live import merge, ram_merge, SnapshotStore, RAMSchedule, TopK\n"
        "import ram_live.integrations.lightning, ram_live.integrations.transformers, ram_live.integrations.verl\n"
        "try:\n"
        "    ram_live.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_package_is_in_the_wheel():
    """pyproject lists packages by hand (``integrations/`` installs as ``ram_live.integrations``): a sub-package
    missing there would be left out of the wheel while the editable install used by the tests still finds it."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {"ram_live": root / "ram_live", **{k: root / v for k, v in setup.get("package-dir", {}).items()}}
    found = set()
    for name, folder in dirs.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            found.add(".".join((name, *rel)))
    assert found == set(setup["packages"])
