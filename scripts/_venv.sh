#!/usr/bin/env bash
# Shared by env.sh and test_verl.sh (sourced): creates (once) and activates a virtual environment with the CPU
# build of torch 2.13.0 installed first — the pinned build lies on this machine's disk; an unpinned torch would
# pull a multi-GB CUDA build — then runs the caller's install function. Reinstalls when pyproject.toml (or the
# optional extra file) is newer than the environment's stamp.
#   ram_live_venv <venv> <stamp name> <install function> [extra file]
ram_live_venv() {
  local venv="$1" stamp="$1/$2" install="$3" extra="${4:-}"
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  local python="${PYTHON:-python3.11}"
  command -v "$python" >/dev/null 2>&1 || python=python3
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
  fi
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
  if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ] || { [ -n "$extra" ] && [ "$extra" -nt "$stamp" ]; }; then
    python -m pip install -q --upgrade pip
    python -m pip install -q "torch==2.13.0"
    "$install"
    touch "$stamp"
  fi
}
