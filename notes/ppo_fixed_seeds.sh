#!/usr/bin/env bash
# One warm start, then PPO (RLOO, binary reward, dynamic sampling, 16 tasks x 4, lr 5e-5, 80 iterations) in fixed
# mode from it with several seeds, two jobs at a time on the 2 cores: the session-7 experiments of notes/ppo_fixed.md.
#
#   bash notes/ppo_fixed_seeds.sh NAME 'WORLD OVERRIDES' SEED [SEED ...]
#   bash notes/ppo_fixed_seeds.sh r 'train.fixed_source=reserved train.fixed_tasks=256' 0 1 2 3 4
#   bash notes/ppo_fixed_seeds.sh v1 'warmstart.level_tasks=[100,100,1800]' 0 1 2 3 4    # RL on fresh tasks
#
# The world overrides go to the warm start and to every RL run (after the RL settings, so they win). Writes
# runs/ws_NAME/warmstart (~25 min; its seeded evaluations ws_seedK.json beside it) and runs/NAME_wK (~18 min per two
# seeds), then prints the paired changes (notes/paired_seeds.py) at iterations 40 and 80.
set -euo pipefail
set -f  # overrides such as [100,100,1800] are not file patterns
name=$1
read -r -a extra <<< "$2"
shift 2
seeds=("$@")
world=(configs/tiny.yaml eval.tasks_per_split=200 'tasks.heldout_splits=[]')
rl=(train.steps=80 train.eval_every=40 train.checkpoint_every=20 ppo.lr=5e-5 ppo.advantage=rloo
    ppo.skip_uniform_groups=true train.solver_tasks=16 train.fixed_tasks=512 train.fixed_source=fresh
    reward.correctness=0 reward.solved=1)
ws=runs/ws_$name

[ -e "$ws/warmstart/checkpoints/latest" ] ||
    selfplay compare "${world[@]}" "${extra[@]}" --seeds 0 --shared-warmstart --arms warmstart --out "$ws" > "$ws.log" 2>&1

job() {  # "rl K": the RL run of seed K; "eval": the warm start's seeded evaluations (one process, in turn)
    if [ "$1" = rl ]; then
        local out=runs/${name}_w$2
        mkdir -p "$out" && [ -e "$out/warmstart" ] || cp -r "$ws/warmstart" "$out/warmstart"
        selfplay compare "${world[@]}" "${rl[@]}" "${extra[@]}" --seeds "$2" --shared-warmstart \
            --arms warmstart fixed --out "$out" > "$out.log" 2>&1
    else  # written under temporary names, then moved: two runners that share a warm start may both evaluate it
        for k in "${seeds[@]}"; do
            local tmp=$ws/.ws_seed$k.$$
            [ "$k" = 0 ] || [ -e "$ws/ws_seed$k.json" ] || {
                selfplay eval "$ws/warmstart" --suite heldout --seed "$k" --json "$tmp.json" --plot "$tmp.png" \
                    >> "$ws.log" 2>&1 && mv "$tmp.png" "$ws/ws_seed$k.png" && mv "$tmp.json" "$ws/ws_seed$k.json"; }
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
for step in 40 80; do  # a run with train.eval_every=80 has no evaluation at 40: paired_seeds.py says so
    python notes/paired_seeds.py "$ws/warmstart" "$step" "${runs_done[@]}" || echo "(no read-out at iteration $step)"
done
