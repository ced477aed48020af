"""The registry loads the built-in families on first use: once, for every thread that asks at the same time, and a
family that cannot import is named at every ask (fresh processes: the first use is what is tested)."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> None:
    """``code`` in a fresh process; its assertions must hold (its stderr shown otherwise)."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_threads_asking_at_first_use_all_find_the_built_in_methods():
    code = (
        "import threading, torch, ram_live\n"
        "errors, barrier = [], threading.Barrier(6)\n"
        "def go():\n"
        "    barrier.wait()\n"
        "    try:\n"
        "        ram_live.get_method('ram_plus'); ram_live.merge([{'w': torch.ones(4)}, {'w': torch.ones(4) * 2}],\n"
        "                                                  base={'w': torch.zeros(4)}, method='ties')\n"
        "    except Exception as exc:\n"
        "        errors.append(repr(exc))\n"
        "threads = [threading.Thread(target=go) for _ in range(6)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "assert not errors, errors\n"
        "names = set(ram_live.available_methods())\n"
        "assert {'ram', 'ram_plus', 'ram_plus_soft', 'ties', 'dare_ties', 'linear'} <= names\n"
    )
    _run(code)


def test_a_family_that_cannot_import_is_named_at_every_ask():
    code = (
        "import sys, ram_live\n"
        "sys.modules['ram_live.methods.dare'] = None  # as if the module failed to import\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        ram_live.get_method('ram')\n"
        "    except ImportError as exc:\n"
        "        assert 'ram_live.methods.dare' in str(exc), exc\n"
        "    else:\n"
        "        raise AssertionError('no ImportError')\n"
    )
    _run(code)


def test_registering_before_first_use_still_refuses_a_built_in_name():
    code = (
        "import dataclasses, pytest, ram_live\n"
        "from ram_live.errors import MethodExistsError\n"
        "@dataclasses.dataclass\n"
        "class C:\n"
        "    pass\n"
        "with pytest.raises(MethodExistsError):\n"
        "    ram_live.register_method('ram', C, lambda deltas, ctx, config: deltas.sum(0))\n"
    )
    _run(code)
