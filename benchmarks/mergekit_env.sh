#!/usr/bin/env bash
# Create (idempotently) the benchmark-only virtual environment that holds mergekit,
# used as an external oracle / speed baseline for ram_live's RAM merge.
#
#   bash benchmarks/mergekit_env.sh            # create or reuse benchmarks/.venv-mergekit
#   FORCE=1 bash benchmarks/mergekit_env.sh    # wipe and recreate it
#
# mergekit (LGPL) is a benchmark tool only: it is never a dependency of ram_live and is
# never imported by it; benchmarks/mergekit_ram_worker.py runs inside this env as a subprocess.
#
# torch==2.13.0 is installed FIRST (a CPU wheel that lies on this machine's disk) and is held by
# a constraints file for every later install, so mergekit's own torch requirement can never
# upgrade it to a multi-GB CUDA build.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${MERGEKIT_VENV:-$HERE/.venv-mergekit}"
PYTHON="${PYTHON:-python3.11}"
TORCH_VERSION="2.13.0"
# 0.1.5 is the smallest release on PyPI that ships mergekit/merge_methods/ram.py
# (0.1.4 and the 0.0.x series have no RAM method).
MERGEKIT_VERSION="0.1.5"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "mergekit_env.sh: $PYTHON not found (Python 3.11 needed)" >&2
    exit 1
fi

if [[ "${FORCE:-0}" == "1" && -d "$VENV" ]]; then
    rm -rf "$VENV"
fi

VPY="$VENV/bin/python"

# pip, with this machine's harmless "Location 'file://...' is ignored" index warnings filtered out.
vpip() {
    "$VPY" -m pip "$@" 2>&1 | { grep -v "^WARNING: Location 'file://" || true; }
    return "${PIPESTATUS[0]}"
}

# Fast path: everything already installed at the right versions.
if [[ -x "$VPY" ]] && "$VPY" - "$TORCH_VERSION" "$MERGEKIT_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
want_torch, want_mk = sys.argv[1], sys.argv[2]
ok = version("torch").split("+")[0] == want_torch and version("mergekit") == want_mk
import mergekit.merge_methods.ram  # noqa: F401  (the RAM method must be importable)
sys.exit(0 if ok else 1)
PY
then
    echo "mergekit env ready: $VENV (torch $TORCH_VERSION, mergekit $MERGEKIT_VERSION)"
    exit 0
fi

start=$(date +%s)
if [[ ! -x "$VPY" ]]; then
    "$PYTHON" -m venv "$VENV"
fi

CONSTRAINTS="$VENV/torch-constraints.txt"
printf 'torch==%s\n' "$TORCH_VERSION" > "$CONSTRAINTS"

vpip install --quiet --upgrade pip
vpip install --quiet -c "$CONSTRAINTS" "torch==$TORCH_VERSION"

# Refuse to go on if resolving mergekit would replace torch.
plan=$(vpip install --dry-run -c "$CONSTRAINTS" "mergekit==$MERGEKIT_VERSION" 2>&1) || {
    echo "$plan" >&2
    echo "mergekit_env.sh: mergekit==$MERGEKIT_VERSION cannot be resolved with torch==$TORCH_VERSION" >&2
    exit 1
}
if grep -E '^Would install ' <<<"$plan" | tr ' ' '\n' | grep -E '^torch-[0-9]' \
        | grep -qv "^torch-${TORCH_VERSION}\(+.*\)\?$"; then
    echo "$plan" >&2
    echo "mergekit_env.sh: installing mergekit would change torch; aborting" >&2
    exit 1
fi

vpip install --quiet -c "$CONSTRAINTS" "mergekit==$MERGEKIT_VERSION"

"$VPY" - "$TORCH_VERSION" "$MERGEKIT_VERSION" <<'PY'
import sys
from importlib.metadata import version
import torch, mergekit.merge_methods.ram  # noqa: F401
assert version("torch").split("+")[0] == sys.argv[1], version("torch")
assert version("mergekit") == sys.argv[2], version("mergekit")
print(f"torch {torch.__version__} (cuda: {torch.version.cuda}), mergekit {version('mergekit')}")
PY
echo "mergekit env ready: $VENV ($(( $(date +%s) - start )) s)"
