#!/usr/bin/env bash
# Builds (once) a separate virtual environment for the verl integration — verl 0.9.x pins transformers < 5.11,
# while the main environment (.venv, scripts/env.sh) has a newer one — and runs tests/verl in it.
# CPU only: torch 2.13.0 (CPU build) first, then ram-live and verl's core extra with torch held at that pin
# (verl's cpu/fsdp/vllm extras are never installed). Safe to re-run; RAM_LIVE_VERL_VENV moves the environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RAM_LIVE_VERL_VENV:-$root/.venv-verl}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
stamp="$venv/.ram-live-verl-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ] || [ "$0" -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # The pinned CPU build lies on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  constraints="$venv/torch-constraints.txt"
  echo "torch==2.13.0" > "$constraints"
  python -m pip install -q -c "$constraints" -e "$root" "verl[verl-core]>=0.9.1,<0.10" "pytest>=8"
  touch "$stamp"
fi
cd "$root"
exec python -m pytest -q -p no:asyncio tests/verl "$@"
