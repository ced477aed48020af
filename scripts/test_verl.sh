#!/usr/bin/env bash
# Builds (once) a separate virtual environment for the verl integration — verl 0.9.x pins transformers < 5.11,
# while the main environment (.venv, scripts/env.sh) has a newer one — and runs tests/verl in it.
# CPU only: torch 2.13.0 (CPU build) first, then ram-live (with optuna: the search's sampler and storage keys) and
# verl's core extra with torch held at that pin (verl's cpu/fsdp/vllm extras are never installed). Safe to re-run;
# RAM_LIVE_VERL_VENV moves the environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RAM_LIVE_VERL_VENV:-$root/.venv-verl}"
# shellcheck source=scripts/_venv.sh
. "$root/scripts/_venv.sh"
_verl_install() {
  local constraints="$venv/torch-constraints.txt"
  echo "torch==2.13.0" > "$constraints"
  python -m pip install -q -c "$constraints" -e "$root[optuna]" "verl[verl-core]>=0.9.1,<0.10" "pytest>=8"
}
ram_live_venv "$venv" .ram-live-verl-installed _verl_install "$0"
cd "$root"
exec python -m pytest -q -p no:asyncio tests/verl "$@"
