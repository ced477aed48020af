"""Callables named by a dotted path in a config or on the command line (``"pkg.module:fn"``, ``"pkg.module.fn"``,
or verl's ``"/path/to/file.py:fn"``), torch-free: the one loader of the search's, the callbacks', verl's and the
CLI's functions."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from .errors import ConfigError

__all__ = ["load_callable"]


def load_callable(value: Any, option: str, *, from_cwd: bool = False) -> Callable[..., Any]:
    """``value`` itself when callable, else the function its path names.

    Args:
        value: a callable, or ``"pkg.module:fn"`` / ``"pkg.module.fn"`` / ``"path/to/file.py:fn"`` (a Python file
            run as a module of its own, as verl's ``custom_reward_function`` names one).
        option: how errors name the option (``"ram.evaluate"``, ``"--eval"``).
        from_cwd: make the current folder importable first (the CLI's ``--eval my_evals:score``).

    Raises:
        ConfigError: naming ``option`` and the path, when the path is malformed, its module does not import
            (also when importing it calls ``sys.exit``: any exception but ``KeyboardInterrupt``), or it names
            nothing callable.

    >>> load_callable("math:sqrt", "evaluate")(4.0)
    2.0
    """
    if callable(value):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{option} takes a callable or 'package.module:function', got {type(value).__name__}")
    file, sep, file_name = value.rpartition(":")
    from_file = bool(sep) and file.endswith(".py")
    if from_file:
        module, name = file, file_name
        if not name.isidentifier():
            raise ConfigError(f"{option} takes path/to/file.py:function, got {value!r}")
    else:
        module, _, name = value.partition(":") if ":" in value else value.rpartition(".")
        if not module or not name or not all(part.isidentifier() for part in (*module.split("."), name)):
            raise ConfigError(f"{option} takes package.module:function, got {value!r}")
        if from_cwd and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
    try:
        loaded = _from_file(Path(module), option, value) if from_file else importlib.import_module(module)
    except ConfigError:
        raise
    except ImportError as exc:
        raise ConfigError(f"{option}={value!r}: cannot import {module!r} ({exc})") from None
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:  # the module calls sys.exit() (or exit()) at import: never a silent exit 0
        raise ConfigError(f"{option}={value!r}: importing {module!r} called sys.exit({exc.code!r})") from None
    except BaseException as exc:  # the module itself fails while it is imported (SyntaxError, NameError, ...)
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ConfigError(f"{option}={value!r}: importing {module!r} raised {detail}") from exc
    fn = getattr(loaded, name, None)
    if fn is None:
        raise ConfigError(f"{option}={value!r}: {module!r} has no function {name!r}")
    if not callable(fn):
        raise ConfigError(f"{option}={value!r}: {module}.{name} is not callable")
    return fn


def _from_file(path: Path, option: str, value: str) -> ModuleType:
    """The Python file ``path`` run as a module of its own (not put in ``sys.modules``)."""
    if not path.is_file():
        raise ConfigError(f"{option}={value!r}: no file {path}")
    spec = importlib.util.spec_from_file_location(f"ram_live_loaded_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{option}={value!r}: {path} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
