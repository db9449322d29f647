#!/usr/bin/env bash
# Self-play on a SLURM cluster: one srun task per node, each running torchrun with one process per GPU.
#
#   sbatch slurm/selfplay.sh                                   # configs/tiny.yaml, defaults below
#   sbatch slurm/selfplay.sh configs/gpu_1.5b.yaml run.dir=/shared/runs/exp1 train.steps=2000
#   sbatch --nodes=4 slurm/selfplay.sh configs/gpu_7b.yaml     # sbatch options override the #SBATCH lines
#   NPROC_PER_NODE=2 sbatch --export=ALL slurm/selfplay.sh configs/smoke.yaml   # CPU-only nodes: 2 ranks (gloo)
#
# Preemption: SLURM sends USR1 to this script `--signal` seconds before the time limit, and SIGTERM to every process
# of the job when it preempts it (then SIGKILL after the partition's GraceTime/KillWait). Both are answered alike: the
# trap writes a stop file that the ranks poll at each stage boundary of an iteration, and SIGTERM reaches the ranks
# themselves (torchrun ignores it here, instead of killing its workers 30 s later); the ranks checkpoint the last
# completed step (or finish an iteration whose update is done), exit 0, and this script requeues the job, which
# resumes from that checkpoint (run.dir must be on shared storage).
# The USR1 lead: a stop is answered within the longest stage of an iteration plus the checkpoint's write, and SLURM
# may send the signal up to 60 s late; the longest stage measured (docs/pretrained.md, the 1.5B world on a CPU: the
# PPO updates, 119 + 11 s) plus a checkpoint plus 60 s is about 200 s, so 300 s leaves a margin. The ranks measure
# that bound every iteration (`time/stop_bound_s`: the longest stage plus the last checkpoint's write) and warn once
# when it, plus 60 s, passes SIGNAL_LEAD below: then raise both (docs/cluster.md, Preemption).
#
# Edit these defaults for your cluster:
#SBATCH --job-name=selfplay
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --output=slurm-%x-%j.out
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
# GPUs per node: add e.g. "#SBATCH --gpus-per-node=8" on a GPU cluster (one rank per GPU).
# Cores: the one task per node gets every core SLURM allocated on it (--exclusive: the whole node), passed to srun
# explicitly (srun does not inherit --cpus-per-task since Slurm 22.05); its ranks, their sandbox workers and engines
# share them, and each rank sizes its sandbox pool by its CPU affinity divided by the node's ranks.
# Networking: set GLOO_SOCKET_IFNAME (CPU ranks) or NCCL_SOCKET_IFNAME to the interface the nodes reach each other
# on when the default route's is not it; NCCL_DEBUG=INFO prints NCCL's choice of transport at start.
set -euo pipefail

CONFIG=${1:-configs/tiny.yaml}
[ $# -gt 0 ] && shift
OVERRIDES=("$@")

cd "${SLURM_SUBMIT_DIR:-$(pwd)}"
if [ ! -f "$CONFIG" ]; then
  echo "selfplay.sh: config file not found: $CONFIG (paths are relative to the submit directory $(pwd))" >&2
  exit 2
fi

# ---- rendezvous: the first node of the allocation is the master ------------------------------------------
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
export MASTER_ADDR MASTER_PORT

# ---- processes per node: one per GPU, else NPROC_PER_NODE (CPU ranks) ---------------------------------------
if [ -z "${NPROC_PER_NODE:-}" ]; then
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ] && [ "${SLURM_GPUS_ON_NODE}" -gt 0 ] 2>/dev/null; then
    NPROC_PER_NODE=$SLURM_GPUS_ON_NODE
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    NPROC_PER_NODE=$(nvidia-smi -L | wc -l)
  else
    NPROC_PER_NODE=1
  fi
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  export NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1
else
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi

# ---- cores: every core allocated on the node goes to its one task --------------------------------------------
CPUS_PER_TASK=${SLURM_CPUS_ON_NODE:-$(nproc)}
export SRUN_CPUS_PER_TASK=$CPUS_PER_TASK

# ---- preemption: USR1 or TERM -> stop file -> checkpoint -> requeue ------------------------------------------
SIGNAL_LEAD=300  # seconds: keep equal to `#SBATCH --signal=B:USR1@...` above (a test holds them together)
export SELFPLAY_SIGNAL_LEAD=${SELFPLAY_SIGNAL_LEAD:-$SIGNAL_LEAD}  # the ranks warn when a stop may not fit in it
export SELFPLAY_STOP_FILE="${SLURM_SUBMIT_DIR:-$(pwd)}/.selfplay-stop-${SLURM_JOB_ID}"
rm -f "$SELFPLAY_STOP_FILE"
on_stop() {
  echo "selfplay.sh: $1 received at $(date -u +%FT%TZ): asking ranks to checkpoint and stop"
  touch "$SELFPLAY_STOP_FILE"
}
trap 'on_stop USR1' USR1
trap 'on_stop TERM' TERM
# torchrun answers SIGTERM by sending it on to its workers and killing them 30 s later, mid-iteration: here it
# ignores it (`--signals-to-handle` without it, where torchrun has the option; the ignored signal is inherited
# across exec), and each rank handles its own SIGTERM (a stop request)

echo "selfplay.sh: job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0}: $SLURM_NNODES node(s) x $NPROC_PER_NODE" \
     "process(es), $CPUS_PER_TASK cores a node, master $MASTER_ADDR:$MASTER_PORT, config $CONFIG ${OVERRIDES[*]:-}"

srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task="$CPUS_PER_TASK" bash -c '
  echo "selfplay.sh: node $SLURM_NODEID: $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) usable cores"
  trap "" TERM
  signals=()
  if python -m torch.distributed.run --help 2>/dev/null | grep -q -- --signals-to-handle; then
    signals=(--signals-to-handle SIGINT,SIGHUP,SIGQUIT)
  fi
  exec python -m torch.distributed.run "${signals[@]}" --nnodes "$SLURM_NNODES" --node_rank "$SLURM_NODEID" \
    --nproc_per_node "'"$NPROC_PER_NODE"'" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    --max_restarts 0 -m selfplay train "$@"' selfplay "$CONFIG" "${OVERRIDES[@]}" &
SRUN_PID=$!
# `wait` returns early when a trapped signal arrives: keep waiting until srun itself has ended
status=0
while true; do
  wait "$SRUN_PID" && status=0 || status=$?
  kill -0 "$SRUN_PID" 2>/dev/null || break
done

if [ -f "$SELFPLAY_STOP_FILE" ]; then
  rm -f "$SELFPLAY_STOP_FILE"
  if [ "$status" -eq 0 ]; then
    echo "selfplay.sh: checkpoint written; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
  fi
fi
echo "selfplay.sh: finished with status $status"
exit "$status"
