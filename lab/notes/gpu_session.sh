#!/usr/bin/env bash
# What ran on a lent H200 machine (one device call): the GPU check of slurm/gpu_check.sh with its default small
# Llama (fp32), the same with a 405 M-parameter Llama in bf16, then notes/preset_memory.py for the presets' shapes.
# The machine has torch and transformers but not omegaconf or radon: `.devsite/` carries omegaconf, antlr4, radon and
# mando (pure Python, copied from this checkout's site-packages; ignored by git, named in the device call's carry).
# Logs go to $OUT (default /tmp/gpu_session).
#
#   bash lab/notes/gpu_session.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/.devsite${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
} 2>&1 | tee "$OUT/env.txt"
t0=$(date +%s)
timeout 280 bash slurm/gpu_check.sh /tmp/gpu_a > "$OUT/a.log" 2>&1
echo "A (gpu_check defaults): rc $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/env.txt"
if (( $(date +%s) - t0 < 220 )); then
  timeout 240 bash slurm/gpu_check.sh /tmp/gpu_b model.n_layer=24 model.n_embd=1024 model.n_head=16 \
    model.dtype=bfloat16 > "$OUT/b.log" 2>&1
  echo "B (24 x 1024 Llama, bf16): rc $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/env.txt"
fi
if (( $(date +%s) - t0 < 420 )); then
  timeout 120 python3 notes/preset_memory.py --json "$OUT/preset_memory.json" > "$OUT/c.log" 2>&1
  echo "C (preset shapes): rc $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/env.txt"
fi
for f in a b c; do [ -f "$OUT/$f.log" ] && { echo "== $f"; grep -v "warn" "$OUT/$f.log" | tail -22; }; done
