"""torch.distributed and DeepSpeed, or a single plain process, behind a few small functions.

- `init_distributed()` joins the process group torchrun describes in the environment (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR/PORT), or returns a single-process `DistInfo` when there is none;
- `wrap_model(model, ppo_cfg, dist_cfg, info)` returns (engine, None) from `deepspeed.initialize` with a ZeRO config
  from `configs/deepspeed/` (its "auto" fields filled from the `ppo:` section), or (model, AdamW) without DeepSpeed
  (DistributedDataParallel when there are several processes);
- `barrier`, `broadcast_object`, `gather_objects`, `all_reduce_sum`, `all_reduce_mean`,
  `weighted_mean_over_ranks`: no-ops in a single process; across ranks each records how long this rank waited in it
  (`WAITS`: the longest wait since the loop last asked, and a warning, once per collective, when a wait passes
  `distributed.max_wait_fraction` of `distributed.timeout_min`: a rank that works alone while the others wait);
- `gathered_one_by_one`: a ZeRO-3 model's whole tensors one parameter at a
  time (the weight sync, the checkpoint's Hugging Face copy, `param_checksum`), never the whole model gathered at once;
- `Heartbeat`: rank liveness through the rendezvous store, so that a rank that dies or freezes is named and the
  others end within `distributed.timeout_min`, inside a collective or not (a warm start, a file-system wait).

On a CPU (no CUDA) DeepSpeed runs with DS_ACCELERATOR=cpu over gloo. Every config in configs/deepspeed/ uses
`"torch_adam": true`: PyTorch's own AdamW instead of DeepSpeed's FusedAdam, which each rank would otherwise JIT-build
at start and which fails where `nvcc` does not match torch's CUDA (the first CPU run still JIT-builds a small comm op,
about 50 s, cached under ~/.cache). Under bf16, ZeRO keeps fp32 master weights and optimiser states either way.

`python -m selfplay.rl.smoke --smoke OUT` (under torchrun) runs a few PPO steps on a tiny model with these helpers and
writes each rank's parameter checksum to OUT/rank_N.json: a quick check that a cluster setup trains and stays in
sync (it lives with the trainer it runs, so that this ground-floor module imports nothing of rl/).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from selfplay.runtime.config import CONFIG_DIR
from selfplay.runtime.errors import UserError

DEEPSPEED_CONFIG_DIR = CONFIG_DIR / "deepspeed"


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: global rank, number of processes, rank on this node, backend (None = single)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0 owns logging, corpus writes and checkpoint markers."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def local_device(local_rank: int | None = None) -> torch.device:
    """The device this process computes on: GPU `local_rank` (default: $LOCAL_RANK, else 0) when CUDA is there,
    else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank)


def _default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(backend: str = "", timeout_min: int = 30, max_wait_fraction: float = 0.5) -> DistInfo:
    """Join the torchrun process group (idempotent); a single process when WORLD_SIZE is unset or 1.
    Starts the `Heartbeat` that names a dead or frozen rank and ends this one within `timeout_min`, and states the
    bound on a wait in a collective (`WAITS`: `max_wait_fraction` of `timeout_min`)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # must be set before deepspeed is imported
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world_size <= 1:
        return DistInfo()
    backend = backend or _default_backend()
    WAITS.bound(max_wait_fraction, timeout_min)
    if not dist.is_initialized():
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        try:
            dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=timeout_min))
        except (dist.DistStoreError, dist.DistNetworkError) as exc:
            where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            raise UserError(
                f"rank {os.environ.get('RANK')}: not all {world_size} ranks met at {where} within "
                f"distributed.timeout_min ({timeout_min} min): start every rank (WORLD_SIZE = nodes x "
                f"processes per node) and let each node reach MASTER_ADDR ({exc})"
            ) from exc
        Heartbeat.start_for(dist.get_rank(), dist.get_world_size(), timeout_min * 60.0)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, backend)


class RankLost(UserError):
    """Another rank died or froze (raised in the main thread by the `Heartbeat`)."""


class Heartbeat(threading.Thread):
    """Rank liveness through the rendezvous store at MASTER_ADDR:MASTER_PORT, apart from the collectives.

    Every rank bumps its own counter in the store every `BEAT_S`; rank 0 watches every rank's counter, the others
    watch rank 0's. A watched counter that stands still for `timeout_s`, or a store that stops answering (it lives
    in rank 0's process, or in its torchrun agent), ends this rank with a message naming the lost one: `RankLost`
    in the main thread, and after `GRACE_S` a hard exit if the main thread is stuck in a collective (a lost store
    is first given `LOST_S`: after a normal end rank 0 exits while the others are still closing). A collective
    fails on its own sooner when a peer's process is gone; `sys.excepthook` then watches the counters for
    `SETTLE_S` and adds to the error which ranks stopped beating (an uncaught error of a distributed run thus
    exits `SETTLE_S` later)."""

    BEAT_S, SETTLE_S, GRACE_S, LOST_S = 1.0, 8.0, 15.0, 30.0

    def __init__(self, rank: int, world: int, timeout_s: float, store):
        super().__init__(name="selfplay-heartbeat", daemon=True)
        self.rank, self.timeout_s, self.store = rank, timeout_s, store
        self.watched = list(range(1, world)) if rank == 0 else [0]
        self.prefix = f"selfplay/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self.seen = {r: (-1, time.monotonic()) for r in self.watched}  # rank -> (counter, when it last moved)
        self.store_lost = False
        self.reporting = False  # the main thread is in the excepthook, naming the lost ranks itself
        self.message = ""
        self.can_interrupt = False  # SIGUSR2 raises RankLost in the main thread (set up from the main thread only)
        self.stopping = threading.Event()  # set at exit (`stop`): the thread ends between two store calls

    @classmethod
    def start_for(cls, rank: int, world: int, timeout_s: float) -> Heartbeat:
        """A second client of the rendezvous store (not the process group's), the thread, the hooks."""
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=min(timeout_s, 60.0)),
        )
        beat = cls(rank, world, timeout_s, store)
        store.set(f"{beat.prefix}who/{rank}", f"{os.uname().nodename}, pid {os.getpid()}")
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR2, beat._raise_in_main)
            beat.can_interrupt = True
        previous = sys.excepthook
        sys.excepthook = lambda *exc: beat._excepthook(previous, *exc)
        beat.start()
        atexit.register(beat.stop)
        return beat

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the thread and wait for it (registered to run at exit). A daemon thread still inside a store call when
        the interpreter finalises is ended by the C library in the middle of C++ code, which aborts the process
        ("terminate called without an active exception") after its work is done; so it is stopped first."""
        self.stopping.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout_s)

    def who(self, rank: int) -> str:
        key = f"{self.prefix}who/{rank}"
        try:
            if not self.store_lost and self.store.check([key]):
                return f"rank {rank} ({self.store.get(key).decode()})"
        except Exception:  # noqa: BLE001 - the store itself may be gone
            pass
        return f"rank {rank}"

    def run(self) -> None:
        while not self.stopping.wait(self.BEAT_S):
            try:
                self.store.add(f"{self.prefix}beat/{self.rank}", 1)
                for r in self.watched:
                    count = self.store.add(f"{self.prefix}beat/{r}", 0)  # read without waiting for the key
                    if count != self.seen[r][0]:
                        self.seen[r] = (count, time.monotonic())
            except Exception:  # noqa: BLE001 - any store failure means the rank holding it is gone
                self.store_lost = True
                if self.stopping.wait(self.LOST_S):  # this process is exiting: nothing to report
                    return
                if not self.reporting:
                    self._end(
                        f"lost the rendezvous store at {os.environ['MASTER_ADDR']}:"
                        f"{os.environ['MASTER_PORT']}: rank 0 (or its launcher) has ended"
                    )
                return
            stale = [r for r in self.watched if time.monotonic() - self.seen[r][1] > self.timeout_s]
            if stale and not self.reporting:
                self._end(
                    f"{', '.join(map(self.who, stale))} gave no sign of life for {self.timeout_s:.0f} s "
                    f"(dead or frozen; distributed.timeout_min)"
                )
                return

    def silent_ranks(self) -> list[int]:
        """The watched ranks that stop beating within `SETTLE_S` (called after a failed collective)."""
        self.reporting = True
        time.sleep(self.SETTLE_S)
        if self.store_lost:
            return [0] if self.rank else []
        return [r for r, (_, moved) in self.seen.items() if time.monotonic() - moved > self.SETTLE_S / 2]

    def _end(self, message: str) -> None:
        self.message = f"rank {self.rank} on {os.uname().nodename} ends: {message}"
        print(f"[selfplay] {self.message}", file=sys.stderr, flush=True)
        main = threading.main_thread().ident  # set: the main thread runs
        if self.can_interrupt and main is not None:
            signal.pthread_kill(main, signal.SIGUSR2)
        time.sleep(self.GRACE_S)
        os._exit(1)  # the main thread is stuck (e.g. inside a collective) and did not take the RankLost

    def _raise_in_main(self, _signum, _frame) -> None:
        if not self.reporting:
            raise RankLost(self.message)

    def _excepthook(self, previous, exc_type, exc, tb) -> None:
        lost = self.silent_ranks() if issubclass(exc_type, RuntimeError) else []
        previous(exc_type, exc, tb)
        if lost:
            print(
                f"[selfplay] rank {self.rank} on {os.uname().nodename} failed because "
                f"{', '.join(map(self.who, lost))} stopped responding (dead or frozen)",
                file=sys.stderr,
                flush=True,
            )


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class Waits:
    """How long this rank waited in each collective: the longest wait since `take` (the loop logs it once an
    iteration, `time/max_wait_s`), and a warning, once per collective, when a wait passes the stated bound,
    `max_wait_fraction` x `timeout_min` (`distributed.max_wait_fraction`, `distributed.timeout_min`). A long wait
    means another rank worked alone meanwhile (rank 0 writing a checkpoint, the corpus, drawing the solver batch);
    at `timeout_min` the collective itself fails, so the bound warns before a cluster size or a slower file system
    turns that work into a failed run. A collective is named by its kind and the function that called it
    (`barrier in selfplay.train.checkpointing.save`)."""

    KEY = "distributed.max_wait_fraction"

    def __init__(self, fraction: float = 0.5, timeout_min: float = 30.0, warn=None):
        self.bound(fraction, timeout_min)
        self.longest: tuple[str, float] = ("", 0.0)  # (collective, seconds) since the last `take`
        self.warned: set[str] = set()
        self.warn = warn or (lambda line: print(f"[selfplay] {line}", file=sys.stderr, flush=True))

    def bound(self, fraction: float, timeout_min: float) -> None:
        """State the bound: a wait longer than `fraction` of `timeout_min` minutes is warned of."""
        self.fraction, self.timeout_min = float(fraction), float(timeout_min)
        self.limit_s = self.fraction * self.timeout_min * 60.0

    def record(self, name: str, seconds: float) -> None:
        if seconds > self.longest[1]:
            self.longest = (name, seconds)
        if seconds > self.limit_s and name not in self.warned:
            self.warned.add(name)
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            self.warn(
                f"rank {rank} waited {seconds:.1f} s in {name}, more than {self.KEY} ({self.fraction:g}) of "
                f"distributed.timeout_min ({self.timeout_min:g} min) = {self.limit_s:.0f} s: another rank worked "
                f"alone that long (at {self.timeout_min:g} min the collective fails); shorten or share that work, "
                f"or raise distributed.timeout_min (warned once per collective)"
            )

    def take(self) -> tuple[str, float]:
        """The longest wait since the last call (("", 0.0) without one), and a fresh start."""
        out, self.longest = self.longest, ("", 0.0)
        return out

    @contextlib.contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        """Records the block's time under `kind` and the first caller outside this module."""
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_globals.get("__name__") in (__name__, "contextlib"):
            frame = frame.f_back
        name = f"{kind} in {frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.record(name, time.perf_counter() - t0)


WAITS = Waits()  # this process's (one per rank)


def barrier() -> None:
    if is_distributed():
        with WAITS.timed("barrier"):
            dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """`obj` from rank `src` on every rank (any picklable object)."""
    if not is_distributed():
        return obj
    box = [obj]
    with WAITS.timed("broadcast_object"):
        dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    with WAITS.timed("gather_objects"):
        dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(*values: float) -> list[float]:
    """Sums of floats over the ranks, in one collective."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    with WAITS.timed("all_reduce_sum"):
        dist.all_reduce(t)
        return t.tolist()  # (waits for an asynchronous NCCL reduction)


def all_reduce_mean(value: float) -> float:
    """Mean of a float over the ranks (e.g. a metric)."""
    return all_reduce_sum(value)[0] / (dist.get_world_size() if is_distributed() else 1)


def weighted_mean_over_ranks(value: float, weight: float) -> tuple[float, float]:
    """(mean of `value` over the ranks weighted by `weight`, total weight): e.g. a per-sample statistic and each
    rank's sample count, so that every rank gets the same figure as one process holding all samples would."""
    total, weights = all_reduce_sum(value * weight, weight)
    return (total / weights if weights else 0.0), weights


# ---------------------------------------------------------------------------- DeepSpeed


def load_deepspeed_config(name_or_path: str) -> dict:
    """A DeepSpeed JSON config: a file name in configs/deepspeed/ or a path."""
    path = Path(name_or_path)
    if not path.exists():
        path = DEEPSPEED_CONFIG_DIR / name_or_path
    if not path.exists():
        names = sorted(p.name for p in DEEPSPEED_CONFIG_DIR.glob("*.json"))
        raise UserError(f"DeepSpeed config {name_or_path!r} not found (choose one of {names} or give a path)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"DeepSpeed config {path} is not valid JSON: {exc}") from exc


def fill_deepspeed_config(ds: dict, ppo_cfg, world_size: int) -> dict:
    """Replace the "auto" fields with values from the `ppo:` section (batch sizes, clipping, optimiser)."""
    ds = json.loads(json.dumps(ds))  # deep copy
    gas = ppo_cfg.mini_batch_size // ppo_cfg.micro_batch_size
    auto = {
        "train_micro_batch_size_per_gpu": ppo_cfg.micro_batch_size,
        "gradient_accumulation_steps": gas,
        "train_batch_size": ppo_cfg.micro_batch_size * gas * world_size,
        "gradient_clipping": ppo_cfg.max_grad_norm,
    }
    for key, value in auto.items():
        if ds.get(key, "auto") == "auto":
            ds[key] = value
    params = ds.get("optimizer", {}).get("params", {})
    for key, value in {"lr": ppo_cfg.lr, "weight_decay": ppo_cfg.weight_decay}.items():
        if params.get(key) == "auto":
            params[key] = value
    return ds


def wrap_model(model: torch.nn.Module, ppo_cfg, dist_cfg, info: DistInfo):
    """(engine, None) through `deepspeed.initialize`, or (model, AdamW) without DeepSpeed (DDP across ranks)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if dist_cfg.deepspeed:
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        ds_config = fill_deepspeed_config(load_deepspeed_config(dist_cfg.zero_config), ppo_cfg, info.world_size)
        if info.distributed and not dist.is_initialized():
            init_distributed(dist_cfg.backend, dist_cfg.timeout_min)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=ds_config)
        return engine, None
    if torch.cuda.is_available():
        model = model.to(f"cuda:{info.local_rank}")
    optimizer = torch.optim.AdamW(trainable, lr=ppo_cfg.lr, weight_decay=ppo_cfg.weight_decay)
    if info.distributed:
        ids = [info.local_rank] if torch.cuda.is_available() else None
        # a separate critic backbone never uses its LM head; otherwise every parameter takes part in each step
        unused = getattr(model, "critic", None) is not None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=unused)
    return model, optimizer


def gather_one(t: torch.Tensor):
    """A context in which ZeRO-3 parameter `t` is whole (a collective: every rank enters it); else nothing."""
    if hasattr(t, "ds_id"):
        import deepspeed

        return deepspeed.zero.GatheredParameters([t])
    return contextlib.nullcontext()


def gathered_one_by_one(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each (name, whole tensor) of `named`: a ZeRO-3 partitioned parameter is gathered alone while the consumer
    holds it and released before the next (copy it to keep it). A collective: every rank iterates the same names to
    the end."""
    for name, t in named:
        with gather_one(t):
            yield name, t.detach()


def param_checksum(model: torch.nn.Module) -> dict:
    """sha256 over every parameter's bytes (name order) and the float sum: equal models give equal checksums.
    Collective under ZeRO-3 (the partitioned parameters are gathered one at a time): call it on every rank."""
    named = sorted(getattr(model, "module", model).named_parameters())
    h, total = hashlib.sha256(), 0.0
    for name, p in gathered_one_by_one(named):
        data = p.float().cpu().contiguous()
        h.update(name.encode())
        h.update(data.numpy().tobytes())
        total += data.double().sum().item()
    return {"sha256": h.hexdigest(), "sum": total}
