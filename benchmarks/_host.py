"""The host a benchmark runs on, for every table's heading: the CPU's model name and its widest vector ISA, and
the number of threads ram_live's merge uses on it (the floors run with as many).

    from _host import cpu_label, merge_workers
    print(f"## Results ({cpu_label()}, {merge_workers()} merge threads)")   # "Intel(R) Xeon(R) … (AVX-512)"

The benchmarks run as scripts (``python benchmarks/bench_x.py``), so this folder is on ``sys.path``.
"""

from __future__ import annotations

import functools
import platform
import shutil
import subprocess
from pathlib import Path

__all__ = ["cpu_model", "cpu_isa", "isa_of", "cpu_label", "merge_workers"]


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """``lscpu``'s "Model name", else /proc/cpuinfo's "model name", else :func:`platform.processor`."""
    if shutil.which("lscpu"):
        try:
            out = subprocess.run(
                ["lscpu"],
                capture_output=True,
                text=True,
                check=False,
                timeout=10,
                env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"},
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "Model name" and value.strip() not in ("", "-"):
                return " ".join(value.split())
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return " ".join(line.split(":", 1)[1].split())
    return platform.processor() or platform.machine() or "unknown CPU"


@functools.lru_cache(maxsize=1)
def cpu_isa() -> str:
    """ "AVX-512" when /proc/cpuinfo's flags have ``avx512f``, else "AVX2" with ``avx2``, else the machine's arch."""
    return isa_of(_cpuinfo(), platform.machine())


def isa_of(cpuinfo: str, machine: str) -> str:
    """:func:`cpu_isa` of a /proc/cpuinfo text (its first ``flags`` / ``Features`` line) and an arch name."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
            break
    if "avx512f" in flags:
        return "AVX-512"
    if "avx2" in flags:
        return "AVX2"
    return machine or "unknown arch"


def cpu_label() -> str:
    """Model name and ISA, e.g. ``"Intel(R) Xeon(R) Processor @ 2.80GHz (AVX-512)"``."""
    return f"{cpu_model()} ({cpu_isa()})"


def merge_workers() -> int:
    """Threads ram_live's merge shares a tensor's chunks among on CPU (its ``default_workers``)."""
    import importlib

    import torch

    for module in ("ram_live.engine", "ram_live.engine.threads"):  # (the engine is being split into a package)
        try:
            fn = getattr(importlib.import_module(module), "default_workers")
        except (ImportError, AttributeError):
            continue
        return int(fn(torch.device("cpu")))
    raise ImportError("ram_live's default_workers not found in ram_live.engine or ram_live.engine.threads")


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
