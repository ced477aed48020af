#!/usr/bin/env bash
# Creates (once) and activates the project's virtual environment: CPU torch 2.13.0 first, then ram-live with
# its test extras. Sourced by demo.sh, test.sh and bench.sh; safe to re-run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RAM_LIVE_VENV:-$root/.venv}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
stamp="$venv/.ram-live-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # The pinned CPU build lies on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e "$root[test]"
  touch "$stamp"
fi
cd "$root"
