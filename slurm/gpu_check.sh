#!/usr/bin/env bash
# GPU check: a short self-play on one GPU (configs/gpu_check.yaml), then the throughput and memory it measured.
#
#   bash slurm/gpu_check.sh [OUT_DIR] [key=value ...]      # or: sbatch --gpus-per-node=1 slurm/gpu_check.sh
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
PY=${PYTHON:-python3}  # the interpreter that holds torch (some GPU images have no `python`)
OUT=${1:-runs/gpu_check}
[ $# -gt 0 ] && shift
"$PY" - <<'PY'
import torch
print("cuda:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(CPU run)")
PY
start=$(date +%s)
"$PY" -m selfplay train configs/gpu_check.yaml run.dir="$OUT" "$@"
echo "wall time: $(( $(date +%s) - start )) s"
"$PY" - "$OUT" <<'PY'
import statistics, sys
from selfplay.runtime.tb import read_scalars
tags = read_scalars(sys.argv[1])
for tag in sorted(tags):
    if tag.startswith(("perf/", "time/", "sandbox/execs_per_s", "warmstart/seconds", "warmstart/solver_sft_s")):
        values = [v for _, v in tags[tag]]
        print(f"{tag:<36} median {statistics.median(values):10.2f}   max {max(values):10.2f}   ({len(values)} steps)")
PY
