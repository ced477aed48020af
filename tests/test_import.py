"""`import ram_live` pulls in none of the optional extras, nor torch (its exports load on first use), and every
public name imports."""

import subprocess
import sys

import pytest

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
        "import ram_live.probing, ram_live.selection.run\n"  # the modules have names of their own: no shadowing
        "assert callable(ram_live.probe) and callable(ram_live.search) and ram_live.selection.run.search is "
        "ram_live.search\n"
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


def test_the_wheel_holds_every_package_and_the_c_sources(tmp_path):
    """A built wheel (setup.py's discovery, ``integrations/`` mapped to ``ram_live.integrations``) holds every
    package of the tree, every C source of ``csrc/``, and no top-level ``integrations``; building it prints no
    warning of the project's own making (a package left out, an ambiguous data folder)."""
    import zipfile
    from pathlib import Path

    pytest.importorskip("setuptools", minversion="77")
    root = Path(__file__).resolve().parent.parent
    import shutil

    tree = tmp_path / "tree"  # a copy: setuptools builds in the source folder (build/, *.egg-info)
    for name in ("ram_live", "integrations"):
        shutil.copytree(root / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(root / name, tree / name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(tree),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "absent from the `packages` configuration" not in done.stderr, done.stderr
    names = zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist()
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    expected = {str(i.parent.relative_to(root)) for i in (root / "ram_live").rglob("__init__.py")}
    expected |= {"ram_live/" + str(i.parent.relative_to(root)) for i in (root / "integrations").rglob("__init__.py")}
    assert packages == expected
    sources = {p.name for p in (root / "ram_live" / "csrc").iterdir() if p.suffix in (".c", ".h")}
    assert sources and {n.split("/")[-1] for n in names if n.startswith("ram_live/csrc/")} == sources
    assert not any(n.startswith("integrations/") for n in names)


def test_moved_modules_are_gone_from_their_old_paths():
    """A 0.x library moves names instead of keeping shims: the modules that moved into packages import from their
    new paths only (CHANGELOG.md lists where each went)."""
    code = (
        "import importlib, ram_live\n"
        "assert not hasattr(ram_live, 'MOVED_MODULES')\n"
        "for old in ('schedule', 'schedule_search', 'sources', 'sinks', 'distributed', 'dtensor', 'safetensors_io',\n"
        "            'memory'):\n"
        "    try:\n"
        "        importlib.import_module('ram_live.' + old)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    raise AssertionError('ram_live.' + old + ' still imports')\n"
        "from ram_live.training.search import SearchSetting\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_package_root_is_the_front_door():
    """At most 15 modules at the package root; everything else lives in a package named for its job."""
    from pathlib import Path

    import ram_live

    root = Path(ram_live.__file__).parent
    assert len(list(root.glob("*.py"))) <= 15, sorted(p.name for p in root.glob("*.py"))
