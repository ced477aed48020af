#!/usr/bin/env bash
# The tests whose expectations could depend on the CPU (digests, native kernels, probe, snapshot capture), run
# again under torch's AVX2 dispatch with the AVX2 build of the native kernels, then under torch's scalar dispatch:
# an expectation that holds on one CPU only fails here on any x86-64 host. Uses test.sh's environment;
# both runs always run, the exit status is the first failing run's pytest status (0 when both pass).
set -euo pipefail
. "$(dirname "$0")/env.sh"
files=(tests/test_merge_digests.py tests/test_kernel_digests.py tests/test_probe.py tests/test_probe_native.py
       tests/test_ram_native.py tests/test_ram_paths.py tests/test_importance_native.py tests/test_codes_native.py
       tests/test_store_native.py)
# Each run has an inductor cache of its own: torch.compile's cache does not key on ATEN_CPU_CAPABILITY, and code it
# cached under another dispatch runs wrong (compile=True merges overflowed where eager ones did not).
inductor_caches="$(mktemp -d)"
trap 'rm -rf "$inductor_caches"' EXIT
status=0
start=$SECONDS
run=0
for setting in "ATEN_CPU_CAPABILITY=avx2 RAM_LIVE_SIMD=avx2" "ATEN_CPU_CAPABILITY=default"; do
  echo "test_portable.sh: $setting" >&2
  run=$((run + 1))
  rc=0
  env $setting TORCHINDUCTOR_CACHE_DIR="$inductor_caches/$run" \
    python -m pytest -q -p no:cacheprovider "${files[@]}" "$@" || rc=$?
  if [ "$status" = 0 ]; then status=$rc; fi
done
echo "test_portable.sh: $((SECONDS - start)) s for both runs" >&2
exit "$status"
