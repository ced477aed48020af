#!/usr/bin/env bash
# Shared by env.sh and test_verl.sh (sourced): creates (once) and activates a virtual environment with the CPU
# build of torch 2.13.0 installed first (an unpinned torch would pull a multi-GB CUDA build), then runs the
# caller's install function. The CPU build is asked for by name, torch==2.13.0+cpu: from pip's own sources (a
# local wheel or a mirror), else from PyTorch's CPU index; where no +cpu build exists (macOS) plain 2.13.0, which
# is CPU-only there. It stops if the torch it got is a CUDA build. Reinstalls when pyproject.toml (or the
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
    python -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || python -m pip install -q --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu" \
        2>/dev/null \
      || python -m pip install -q "torch==2.13.0"
    if ! python -W ignore -c 'import sys, torch; sys.exit(torch.version.cuda is not None)'; then
      echo "scripts/_venv.sh: pip installed a CUDA build of torch" \
        "($(python -W ignore -c 'import torch; print(torch.__version__)')); these scripts set up CPU torch:" \
        "install torch==2.13.0+cpu into $venv by hand and re-run" >&2
      return 1
    fi
    "$install"
    touch "$stamp"
  fi
}
