#!/usr/bin/env bash
# The main job. Installs what it needs (first run only), then: SFT a tiny base on three verifiable token tasks,
# RL-train one specialist per task (GRPO), snapshot them into a store, probe them, merge them with every method
# and score every merge (examples/rl_merge_demo.py; about 2 minutes on 2 CPU cores, --quick about 1 minute; README has the measured times).
# The 10-second API tour is `python examples/quickstart.py`.
set -euo pipefail
. "$(dirname "$0")/env.sh"
python examples/rl_merge_demo.py "$@"
