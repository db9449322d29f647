#!/usr/bin/env bash
# GPU check. First the prepared check of the machine (`selfplay bench gpu-check`, selfplay/bench/gpu_check.py): the
# Qwen2.5-Coder-1.5B shape with random bf16 weights built on the GPU, one line PASS/FAIL with its figure for each of:
# the shape, one PPO step (DeepSpeed ZeRO-2 where it imports), the memory plan against the measured peak, the weight
# sync into a stand-in receiver, generate tokens/s at batch 64, a checkpoint round trip, ZeRO-3 on one rank; every
# figure in OUT_DIR/gpu_check.json. A few minutes on one H100. Then, only with --selfplay, the short self-play below.
#
#   bash slurm/gpu_check.sh [--tiny] [--selfplay] [--engine hf|vllm|both] [OUT_DIR] [key=value ...]
#   sbatch --gpus-per-node=1 slurm/gpu_check.sh ...
#
# --tiny: the check's 2-layer shape (the CPU; what the tests run). CHECK_ARGS: more options of the check, e.g.
# "--no-deepspeed --gen-batch 32 ppo.micro_batch_size=2" (`selfplay bench gpu-check --help`).
# --selfplay: then one warm start of configs/gpu_check.yaml in OUT_DIR/warm (default OUT_DIR runs/gpu_check), for each
# engine E of --engine (default both) a self-play in OUT_DIR/E from a copy of it with rollout.engine=E and its figures,
# and `selfplay bench rollout` of the engines ($BENCH_ARGS, default "--batch 64 --new 128 --repeats 3") written to
# OUT_DIR/bench_rollout.json; the key=value overrides go to each of these steps. vllm needs `pip install -e .[vllm]`.
# Exit status: 1 when a line of the check FAILs (the self-play still runs when asked), else the self-play's.
# Without network (a lent GPU machine): `bash slurm/gpu_bundle.sh` where pip works fills .whl/ (omegaconf, DeepSpeed,
# ...); carried with the checkout, its wheels are installed first into $WHEEL_SITE (default $TMPDIR/selfplay_wheels),
# put ahead on PYTHONPATH, when the Python here is the one they were fetched for. No .whl/: nothing to do.
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
PY=${PYTHON:-python3}  # the interpreter that holds torch (some GPU images have no `python`)
ENGINE=both
SELFPLAY=0
CHECK=()
while [ $# -gt 0 ]; do
  case "$1" in
    --selfplay) SELFPLAY=1; shift ;;
    --tiny) CHECK+=(--tiny); shift ;;
    --engine) [ $# -ge 2 ] || { echo "gpu_check.sh: --engine takes hf, vllm or both" >&2; exit 2; }
              ENGINE=$2; shift 2 ;;
    --engine=*) ENGINE=${1#--engine=}; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
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
shopt -s nullglob
wheels=(.whl/*.whl)
shopt -u nullglob
if [ ${#wheels[@]} -gt 0 ]; then
  want=$(cat .whl/python-version 2>/dev/null || true)
  have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ -n "$want" ] && [ "$want" != "$have" ]; then
    echo "== .whl/ holds wheels for Python $want, this is $have: not installed"
  else
    site=${WHEEL_SITE:-${TMPDIR:-/tmp}/selfplay_wheels}
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}" \
      || { echo "gpu_check.sh: the wheels of .whl/ did not install into $site" >&2; exit 2; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    echo "== ${#wheels[@]} wheels of .whl/ installed into $site (first on PYTHONPATH)"
  fi
fi
# shellcheck disable=SC2086  # CHECK_ARGS is a list of options
"$PY" -m selfplay bench gpu-check ${CHECK[@]+"${CHECK[@]}"} ${CHECK_ARGS:-} --json "$OUT/gpu_check.json" && status=0 || status=$?
echo "== gpu check: exit $status, figures in $OUT/gpu_check.json"
[ "$SELFPLAY" = 1 ] || exit "$status"
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
exit "$status"
