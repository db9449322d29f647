#!/usr/bin/env bash
# PPO (RLOO, binary reward, dynamic sampling) on fresh one-step programs from a warm start that leaves many of them
# unseen: the session-7 experiment of notes/ppo_fixed.md. Two jobs at a time on the 2 cores.
#
#   bash notes/ppo_fresh_pool.sh NAME LEVEL_TASKS SEED [SEED ...]
#   bash notes/ppo_fresh_pool.sh v1 '[100,100,1800]' 0 1 2 3 4     # ~25 min warm start, then ~18 min per 2 seeds
#
# Writes runs/ws_NAME/warmstart (shared warm start; its seeded evaluations ws_seedK.json beside it) and
# runs/NAME_wK (one RL run per seed), then prints the paired changes (notes/paired_seeds.py) at iterations 40 and 80.
set -euo pipefail
name=$1 level_tasks=$2
shift 2
seeds=("$@")
world=(configs/tiny.yaml eval.tasks_per_split=200 'tasks.heldout_splits=[]' "warmstart.level_tasks=$level_tasks")
rl=(train.steps=80 train.eval_every=40 train.checkpoint_every=20 ppo.lr=5e-5 ppo.advantage=rloo
    ppo.skip_uniform_groups=true train.solver_tasks=16 train.fixed_tasks=512 train.fixed_source=fresh
    reward.correctness=0 reward.solved=1)
ws=runs/ws_$name

[ -e "$ws/warmstart/checkpoints/latest" ] ||
    selfplay compare "${world[@]}" --seeds 0 --shared-warmstart --arms warmstart --out "$ws" > "$ws.log" 2>&1

job() {  # "rl K": the RL run of seed K; "eval": the warm start's seeded evaluations (one process, in turn)
    if [ "$1" = rl ]; then
        local out=runs/${name}_w$2
        mkdir -p "$out" && [ -e "$out/warmstart" ] || cp -r "$ws/warmstart" "$out/warmstart"
        selfplay compare "${world[@]}" "${rl[@]}" --seeds "$2" --shared-warmstart --arms warmstart fixed \
            --out "$out" > "$out.log" 2>&1
    else
        for k in "${seeds[@]}"; do
            [ "$k" = 0 ] || [ -e "$ws/ws_seed$k.json" ] ||
                selfplay eval "$ws/warmstart" --suite heldout --seed "$k" --json "$ws/ws_seed$k.json" >> "$ws.log" 2>&1
        done
    fi
}
jobs=(eval)
for k in "${seeds[@]}"; do jobs+=("rl $k"); done
running=0
for j in "${jobs[@]}"; do
    job $j &
    running=$((running + 1))
    if [ $running -ge 2 ]; then wait -n || echo "a job failed: see the logs"; running=$((running - 1)); fi
done
wait

runs_done=()
for k in "${seeds[@]}"; do runs_done+=("runs/${name}_w$k/seed_$k/fixed"); done
for step in 40 80; do python notes/paired_seeds.py "$ws/warmstart" "$step" "${runs_done[@]}"; done
