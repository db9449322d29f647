"""DeepSpeed ZeRO-2 on CPU/gloo in 2 real processes (torchrun): PPO steps keep the ranks' parameters identical."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from selfplay.runtime import distributed
from selfplay.runtime.config import PPOConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def two_ranks(args: list[str], timeout: float = 400, env: dict | None = None) -> str:
    """`torchrun --nproc_per_node 2 ARGS` on the CPU (gloo, DeepSpeed's CPU accelerator); its output. Fails the test
    on a non-zero exit; a hung run is stopped with its ranks, and the failure shows where each rank was (Python's
    faulthandler, on SIGABRT) (the first DeepSpeed run JIT-builds for ~50 s)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        *args,
    ]
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1", **(env or {}))
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )  # its own process group, so that a hung run can be stopped
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as hung:
        for pid in _children(proc.pid):  # each rank (in a session of its own) prints its threads' stacks and ends
            os.kill(pid, signal.SIGABRT)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        stacks = re.findall(r"Fatal Python error.*?(?=Extension modules|\Z)", output, re.S)  # faulthandler's
        raise AssertionError(
            f"torchrun still running after {timeout:.0f} s; where the ranks were:\n" + "\n".join(stacks)[-12000:]
        ) from hung
    assert proc.returncode == 0, output[-3000:]
    return output


@pytest.mark.distributed
@pytest.mark.parametrize("zero_config", ["zero2_cpu.json", "zero3_cpu.json", None], ids=["zero2", "zero3", "ddp"])
def test_two_ranks_train_and_stay_identical(tmp_path, zero_config):
    """ZeRO-2 (the brief's check), ZeRO-3 (partitioned parameters: generation must run in lockstep) and plain DDP."""
    out = tmp_path / "ranks"
    args = ["-m", "selfplay.rl.smoke", "--smoke", str(out), "--steps", "2"]
    two_ranks(args + (["--zero-config", zero_config] if zero_config else ["--no-deepspeed"]))
    ranks = [json.loads((out / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["before"] == ranks[1]["before"]  # same start
    assert ranks[0]["after"]["sha256"] == ranks[1]["after"]["sha256"]  # same end, bit for bit
    assert ranks[0]["after"]["sha256"] != ranks[0]["before"]["sha256"]  # and training moved them
    # each rank saw its own rollouts, so the gradients were really averaged across processes
    assert (
        ranks[0]["metrics"]["score_mean"] != ranks[1]["metrics"]["score_mean"]
        or ranks[0]["metrics"]["policy_loss"] != ranks[1]["metrics"]["policy_loss"]
    )


def test_single_process_helpers_and_config_filling():
    info = distributed.init_distributed()
    assert info.world_size == 1 and info.is_main and not info.distributed
    assert distributed.broadcast_object({"a": 1}) == {"a": 1}
    assert distributed.gather_objects(3) == [3] and distributed.all_reduce_mean(2.5) == 2.5
    distributed.barrier()
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert distributed.local_device() == expected  # where the warm start and each rank's models go
    ds = distributed.fill_deepspeed_config(
        distributed.load_deepspeed_config("zero2_cpu.json"),
        PPOConfig(mini_batch_size=8, micro_batch_size=2, lr=1e-4),
        world_size=4,
    )
    assert ds["train_micro_batch_size_per_gpu"] == 2 and ds["gradient_accumulation_steps"] == 4
    assert ds["train_batch_size"] == 32 and ds["gradient_clipping"] == 1.0
    assert ds["optimizer"]["params"] == {"lr": 1e-4, "weight_decay": 0.0, "torch_adam": True}
    for name in ("zero1_cpu.json", "zero2.json", "zero3.json", "zero3_cpu.json"):
        loaded = distributed.load_deepspeed_config(name)
        assert loaded["zero_optimization"]["stage"] in (1, 2, 3)
        # PyTorch's AdamW on every config: no FusedAdam JIT build at start (it fails where nvcc != torch's CUDA)
        assert loaded["optimizer"]["params"]["torch_adam"] is True, name
    with pytest.raises(distributed.UserError, match="zero9.json"):
        distributed.load_deepspeed_config("zero9.json")


HEARTBEAT_AT_EXIT = """
import atexit, datetime, os, sys, time
import torch.distributed as dist
from selfplay.runtime.distributed import Heartbeat
port = int(sys.argv[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=30))
beats = []
atexit.register(lambda: print("at exit: alive", beats[0].is_alive(), flush=True))  # runs after the heartbeat's own
beats.append(Heartbeat.start_for(0, 2, 60.0))
time.sleep(3 * Heartbeat.BEAT_S + 0.5)
print("beats", server.add("selfplay/0/beat/0", 0), "alive", beats[0].is_alive(), flush=True)
"""


def test_the_heartbeat_ends_before_the_interpreter_does():
    """A daemon thread still inside a store call when the interpreter finalises is ended by the C library in the
    middle of C++ code, which aborts a rank whose work is done ("terminate called without an active exception");
    the heartbeat is stopped and joined at exit instead, before the handlers registered ahead of it run."""
    proc = subprocess.run(
        [sys.executable, "-c", HEARTBEAT_AT_EXIT, str(free_port())], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    beats, alive = lines[0].split()[1], lines[0].split()[3]
    assert int(beats) >= 2 and alive == "True"  # it was beating
    assert lines[1] == "at exit: alive False"
