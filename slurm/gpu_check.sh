#!/usr/bin/env bash
# GPU check: a short self-play on one GPU (configs/gpu_check.yaml), then the throughput and memory it measured.
#
#   bash slurm/gpu_check.sh [OUT_DIR] [key=value ...]      # or: sbatch --gpus-per-node=1 slurm/gpu_check.sh
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
OUT=${1:-runs/gpu_check}
[ $# -gt 0 ] && shift
python - <<'PY'
import torch
print("cuda:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(CPU run)")
PY
start=$(date +%s)
python -m selfplay train configs/gpu_check.yaml run.dir="$OUT" "$@"
echo "wall time: $(( $(date +%s) - start )) s"
python - "$OUT" <<'PY'
import statistics, sys
from selfplay.tb import read_scalars
tags = read_scalars(sys.argv[1])
for tag in ("perf/solver_gen_tokens_per_s", "perf/solver_update_tokens_per_s", "perf/gpu_peak_mem_gb",
            "time/rollout_s", "time/update_s", "time/sandbox_s", "sandbox/execs_per_s"):
    if tag in tags:
        values = [v for _, v in tags[tag]]
        print(f"{tag:<36} median {statistics.median(values):10.2f}   max {max(values):10.2f}")
PY
