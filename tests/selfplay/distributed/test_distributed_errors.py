"""Bad input and lost ranks in a 2-rank run, started by hand (not torchrun) on this one machine.

Each rank is a plain `python -m selfplay train` with the torch.distributed variables set (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), gloo on the CPU. Storage that another node cannot see is
made real with a mount namespace: rank 1 runs under `unshare -m` with a private tmpfs over the run folder's
parent, so it really cannot see what rank 0 writes there. A lost rank is a real SIGKILL or SIGSTOP.

Every wait has a generous limit that only turns a hang into a failure; no test asserts how fast anything was.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SMOKE, copy_run

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

HOST = os.uname().nodename
HANG_S = 240  # far beyond any expected exit: reaching it means a rank hung


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """Processes of one hand-started distributed run; each writes its output to RUN_LOGS/rank_N.log."""

    def __init__(self, logs: Path, world: int = 2):
        self.logs, self.world, self.port, self.procs = logs, world, free_port(), {}
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, rank: int, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(self.world),
            LOCAL_WORLD_SIZE=str(self.world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(self.port),
        )
        with open(self.log_path(rank), "w") as out:
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "selfplay", "train", *args],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs[rank] = proc
        return proc

    def log_path(self, rank: int) -> Path:
        return self.logs / f"rank_{rank}.log"

    def log(self, rank: int) -> str:
        return self.log_path(rank).read_text(errors="replace")

    def wait(self, rank: int) -> int:
        try:
            return self.procs[rank].wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"rank {rank} still running after {HANG_S} s:\n{self.log(rank)[-3000:]}") from None

    def wait_for_line(self, rank: int, text: str) -> None:
        deadline = time.monotonic() + HANG_S
        while text not in self.log(rank):
            assert self.procs[rank].poll() is None, f"rank {rank} exited:\n{self.log(rank)[-3000:]}"
            assert time.monotonic() < deadline, f"no {text!r} from rank {rank}:\n{self.log(rank)[-3000:]}"
            time.sleep(0.5)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def ranks(tmp_path):
    r = Ranks(tmp_path / "logs")
    yield r
    r.kill_all()


def private_tmpfs_over(folder: Path) -> tuple[str, ...]:
    """A command prefix: run the rest in a new mount namespace where `folder` is an empty private tmpfs."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) not found")
    as_root = () if os.geteuid() == 0 else ("--map-root-user",)
    return (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        *as_root,
        "sh",
        "-c",
        f'mount -t tmpfs none "{folder}" && exec "$@"',
        "sh",
    )


def test_a_run_folder_rank_1_cannot_see_stops_both_ranks_at_start(ranks, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    run = shared / "run"
    args = (*SMOKE, f"run.dir={run}")
    ranks.start(0, *args)
    ranks.start(1, *args, prefix=private_tmpfs_over(shared))
    codes = ranks.wait(0), ranks.wait(1)
    message = f"run.dir {run} is not visible from rank 1 on {HOST}:"  # rank 1 only: rank 0 itself sees it
    for rank, code in enumerate(codes):
        assert code == 2 and message in ranks.log(rank), ranks.log(rank)[-3000:]
    assert list(run.iterdir()) == []  # no checkpoint, corpus or probe left: stopped before any training work
    assert "warm start" not in ranks.log(0)


def test_a_run_folder_rank_0_cannot_create_stops_both_ranks(ranks, tmp_path):
    (tmp_path / "a_file").write_text("")
    run = tmp_path / "a_file" / "run"
    for rank in (0, 1):
        ranks.start(rank, *SMOKE, f"run.dir={run}")
    for rank in (0, 1):
        assert ranks.wait(rank) == 2, ranks.log(rank)[-3000:]
        assert f"run.dir {run} cannot be written by rank 0 on {HOST}" in ranks.log(rank), ranks.log(rank)[-3000:]


def test_a_missing_config_stops_every_rank_before_they_meet(ranks, tmp_path):
    for rank in (0, 1):
        ranks.start(rank, "configs/missing.yaml", f"run.dir={tmp_path / 'run'}")
    for rank in (0, 1):
        assert ranks.wait(rank) == 2 and "config file not found: configs/missing.yaml" in ranks.log(rank)
    assert not (tmp_path / "run").exists()


def test_a_rank_that_never_starts_ends_rank_0_after_the_timeout(ranks, tmp_path):
    ranks.start(0, *SMOKE, f"run.dir={tmp_path / 'run'}", "distributed.timeout_min=1")
    assert ranks.wait(0) == 2
    assert f"rank 0: not all 2 ranks met at 127.0.0.1:{ranks.port} within distributed.timeout_min (1 min)" in ranks.log(
        0
    ), ranks.log(0)[-3000:]
    assert "1/2 clients joined" in ranks.log(0)


def test_a_killed_rank_is_named_by_rank_0(ranks, warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)
    args = (*SMOKE, f"run.dir={run}", "train.steps=40", "distributed.timeout_min=1")
    ranks.start(0, *args)
    rank1 = ranks.start(1, *args)
    ranks.wait_for_line(0, "loaded")  # both ranks are past the start and in the loop
    rank1.send_signal(signal.SIGKILL)
    assert ranks.wait(0) != 0
    log = ranks.log(0)
    assert f"rank 0 on {HOST} failed because rank 1 ({HOST}, pid {rank1.pid}) stopped responding" in log, log[-3000:]


def test_a_frozen_rank_is_named_after_the_timeout(ranks, warm_run, tmp_path):
    run = copy_run(warm_run, tmp_path)
    args = (*SMOKE, f"run.dir={run}", "train.steps=40", "distributed.timeout_min=1")
    ranks.start(0, *args)
    rank1 = ranks.start(1, *args)
    ranks.wait_for_line(0, "loaded")
    rank1.send_signal(signal.SIGSTOP)  # alive but silent: only the timeout can end rank 0
    assert ranks.wait(0) != 0
    log = ranks.log(0)
    # the heartbeat's timeout, or the collective's (then the excepthook names the silent rank)
    assert (
        f"[selfplay] rank 0 on {HOST} ends: rank 1 ({HOST}, pid {rank1.pid}) gave no sign of life for 60 s" in log
        or f"[selfplay] rank 0 on {HOST} failed because rank 1 ({HOST}, pid {rank1.pid}) stopped responding" in log
    ), log[-3000:]


def test_rank_0_dying_in_the_warm_start_ends_rank_1(ranks, tmp_path):
    args = (*SMOKE, f"run.dir={tmp_path / 'run'}", "distributed.timeout_min=1")
    rank0 = ranks.start(0, *args)
    ranks.start(1, *args)
    ranks.wait_for_line(1, "rank 1 of 2")  # rank 1 now waits (on the file system) for rank 0's warm start
    ranks.wait_for_line(0, "warm start")
    rank0.send_signal(signal.SIGKILL)
    assert ranks.wait(1) != 0
    log = ranks.log(1)
    assert f"rank 1 on {HOST} ends: lost the rendezvous store at 127.0.0.1:{ranks.port}" in log, log[-3000:]
