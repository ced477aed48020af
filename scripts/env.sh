#!/usr/bin/env bash
# Creates (once) and activates the project's virtual environment: CPU torch 2.13.0 first, then ram-live with
# its test extras. Sourced by demo.sh, test.sh and bench.sh; safe to re-run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/_venv.sh
. "$root/scripts/_venv.sh"
# The constraint holds torch at the CPU build for every dependency (trl, peft, lightning would take a CUDA torch).
_ram_live_install() {
  printf 'torch==2.13.0\n' > "$VIRTUAL_ENV/torch-constraint.txt"
  python -m pip install -q -c "$VIRTUAL_ENV/torch-constraint.txt" -e "$root[test]"
}
ram_live_venv "${RAM_LIVE_VENV:-$root/.venv}" .ram-live-installed _ram_live_install
cd "$root"
