#!/usr/bin/env bash
# GPU check: a short self-play on one GPU (configs/gpu_check.yaml) on each rollout engine asked for, the throughput
# and memory each measured, then the engines side by side on the same prompts (`selfplay bench rollout`).
#
#   bash slurm/gpu_check.sh [--engine hf|vllm|both] [OUT_DIR] [key=value ...]   # or: sbatch --gpus-per-node=1 ...
#
# --engine (default both): the rollout engine(s) checked. One warm start in OUT_DIR/warm (default runs/gpu_check),
# then for each engine E a self-play in OUT_DIR/E, started from a copy of it with rollout.engine=E, and its figures;
# last `selfplay bench rollout configs/gpu_check.yaml [key=value ...] --engines E... $BENCH_ARGS` (default
# "--batch 64 --new 128 --repeats 3"), written to OUT_DIR/bench_rollout.json. vllm needs `pip install -e .[vllm]`.
# The key=value overrides go to every step. On a machine without a GPU it runs the same steps on the CPU.
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
PY=${PYTHON:-python3}  # the interpreter that holds torch (some GPU images have no `python`)
ENGINE=both
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) [ $# -ge 2 ] || { echo "gpu_check.sh: --engine takes hf, vllm or both" >&2; exit 2; }
              ENGINE=$2; shift 2 ;;
    --engine=*) ENGINE=${1#--engine=}; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
case "$ENGINE" in
  hf|vllm) ENGINES=("$ENGINE") ;;
  both) ENGINES=(hf vllm) ;;
  *) echo "gpu_check.sh: --engine takes hf, vllm or both, got '$ENGINE'" >&2; exit 2 ;;
esac
OUT=${1:-runs/gpu_check}
[ $# -gt 0 ] && shift
BENCH_ARGS=${BENCH_ARGS:---batch 64 --new 128 --repeats 3}
"$PY" - <<'PY'
import torch
print("cuda:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(CPU run)")
PY
if [[ " ${ENGINES[*]} " == *" vllm "* ]]; then
  "$PY" -c "import vllm; print('vllm:', vllm.__version__)" \
    || { echo "gpu_check.sh: --engine $ENGINE needs vLLM: pip install -e .[vllm] (or --engine hf)" >&2; exit 2; }
fi
start=$(date +%s)
"$PY" -m selfplay warmstart configs/gpu_check.yaml run.dir="$OUT/warm" "$@"
echo "warm start: $(( $(date +%s) - start )) s"
for engine in "${ENGINES[@]}"; do
  run="$OUT/$engine"
  [ -d "$run" ] || cp -r "$OUT/warm" "$run"  # an existing folder resumes (train.steps is the total)
  t0=$(date +%s)
  "$PY" -m selfplay train configs/gpu_check.yaml run.dir="$run" "$@" rollout.engine="$engine"
  echo "== self-play on $engine: $(( $(date +%s) - t0 )) s ($run)"
  "$PY" - "$run" <<'PY'
import statistics, sys
from selfplay.runtime.tb import read_scalars
tags = read_scalars(sys.argv[1])
for tag in sorted(tags):
    if tag.startswith(("perf/", "time/", "rollout/logprob_gap", "sandbox/execs_per_s", "warmstart/seconds",
                       "warmstart/solver_sft_s")):
        values = [v for _, v in tags[tag]]
        print(f"{tag:<36} median {statistics.median(values):10.4g}   max {max(values):10.4g}   ({len(values)} steps)")
PY
done
echo "== selfplay bench rollout (${ENGINES[*]}; $BENCH_ARGS)"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
"$PY" -m selfplay bench rollout configs/gpu_check.yaml "$@" --engines "${ENGINES[@]}" $BENCH_ARGS \
  --json "$OUT/bench_rollout.json"
echo "wall time: $(( $(date +%s) - start )) s"
