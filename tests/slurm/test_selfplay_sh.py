"""`sbatch slurm/selfplay.sh` on a real one-node SLURM cluster (slurm/local_cluster.sh; CI starts it), 2 CPU ranks.

Both tests continue a warm-started smoke run (the session's `warm_run`) so that they spend their time in the
distributed loop, not in the warm start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SMOKE, copy_run

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def need_cluster() -> None:
    if shutil.which("sbatch") is None:
        pytest.fail("sbatch not found: install slurm-wlm and munge and run `bash slurm/local_cluster.sh`")
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    if out.returncode != 0 or not re.search(r"idle|mix|alloc", out.stdout):
        pytest.fail(f"no SLURM node up ({out.stdout.strip() or out.stderr.strip()}): run `bash slurm/local_cluster.sh`")


def sbatch(run: Path, *overrides: str) -> str:
    env = dict(os.environ, NPROC_PER_NODE="2")
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--output={run}/slurm-%j.out",
            "slurm/selfplay.sh",
            *SMOKE,
            f"run.dir={run}",
            *overrides,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().split(";")[0]


def job_field(job: str, name: str) -> str | None:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True)
    m = re.search(rf"\b{name}=(\S+)", out.stdout)
    return m.group(1) if m else None


def wait_for(job: str, states: set[str], timeout: float) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = job_field(job, "JobState")
        if state in states:
            return state
        time.sleep(2)
    subprocess.run(["scancel", job])
    raise AssertionError(f"job {job} not in {states} after {timeout:.0f}s (last state {state})")


def latest(run: Path) -> str:
    return (run / "checkpoints" / "latest").read_text().strip()


def state(run: Path) -> dict:
    return json.loads((run / "checkpoints" / latest(run) / "state.json").read_text())


def log_text(run: Path) -> str:
    return "".join(p.read_text() for p in run.glob("slurm-*.out"))


def wait_while(job: str, run: Path, waiting) -> None:
    """While `waiting()` holds and the job is pending or running (at most 900 s: a guard against a hung job, not
    a duration measured), poll every second; a job that ended or a run that hung fails with its log's end."""
    deadline = time.time() + 900
    while waiting():
        assert time.time() < deadline and job_field(job, "JobState") in ("PENDING", "RUNNING"), log_text(run)[-3000:]
        time.sleep(1)


def wait_past_step_0(job: str, run: Path) -> None:
    """Until the job has checkpointed a step of its loop (not only the warm start's step_0)."""
    wait_while(job, run, lambda: latest(run) == "step_0")


def test_sbatch_runs_two_ranks_to_completion(warm_run, tmp_path):
    need_cluster()
    run = copy_run(warm_run, tmp_path)
    job = sbatch(run, "train.steps=2", "distributed.deepspeed=true", "distributed.zero_config=zero2_cpu.json")
    assert wait_for(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 900) == "COMPLETED", log_text(run)[-3000:]
    log = log_text(run)
    assert "1 node(s) x 2 process(es)" in log
    # the node's one task gets every core allocated on it (the whole node here), not the 2 of a default
    cores = int(re.search(r"process\(es\), (\d+) cores a node", log).group(1))
    assert cores == os.cpu_count() and f"node 0: {cores} usable cores" in log
    assert "rank 0 of 2" in log and "rank 1 of 2" in log  # both ranks joined
    st = state(run)
    assert st["step"] == 2 and st["world_size"] == 2 and [h["step"] for h in st["history"]] == [1, 2]
    # DeepSpeed ZeRO-2 engines; the loop compares every rank's weights at each checkpoint (and fails if they differ)
    assert set(st["param_checksums"]) == {"solver", "generator"}
    assert (run / "checkpoints" / "step_2" / "solver" / "deepspeed").is_dir()
    for agent in ("solver", "generator"):
        assert (run / "checkpoints" / "step_2" / agent / "config.json").exists()
    assert (run / "summary.json").exists() and "finished with status 0" in log


def test_usr1_checkpoints_requeues_and_resumes(warm_run, tmp_path):
    need_cluster()
    run = copy_run(warm_run, tmp_path)
    job = sbatch(run, "train.steps=4", "train.checkpoint_every=1")
    wait_past_step_0(job, run)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
    assert wait_for(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 1200) == "COMPLETED", log_text(run)[-3000:]
    log = log_text(run)
    assert "USR1 received" in log and "requeueing job" in log
    assert "restart 1:" in log and int(job_field(job, "Restarts")) >= 1
    stopped_at = int(re.search(r"stop requested: checkpoint step_(\d+) written", log).group(1))
    assert 1 <= stopped_at < 4
    assert f"loaded {run}/checkpoints/step_{stopped_at}" in log  # the requeued job resumed from that checkpoint
    st = state(run)
    assert st["step"] == 4 and [h["step"] for h in st["history"]] == [1, 2, 3, 4]
    assert not (REPO / f".selfplay-stop-{job}").exists()


def test_sigterm_to_the_ranks_and_the_script_checkpoints_requeues_and_resumes(warm_run, tmp_path):
    """SIGTERM to every process of the job step (torchrun and the ranks) and to the script, as a preemption sends it:
    torchrun ignores it instead of killing its workers 30 s later, the ranks checkpoint at the next stage boundary,
    the script requeues the job."""
    need_cluster()
    run = copy_run(warm_run, tmp_path)
    job = sbatch(run, "train.steps=4", "train.checkpoint_every=1")
    wait_past_step_0(job, run)
    subprocess.run(["scancel", "--signal=TERM", job], check=True)  # the step's processes
    subprocess.run(["scancel", "--signal=TERM", "--batch", job], check=True)  # the script
    assert wait_for(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 1200) == "COMPLETED", log_text(run)[-3000:]
    log = log_text(run)
    assert "TERM received" in log and "requeueing job" in log and "restart 1:" in log
    stopped = re.search(r"stop requested: checkpoint step_(\d+) written ([\d.]+) s after the request", log)
    assert stopped and 1 <= int(stopped.group(1)) < 4, log[-3000:]
    assert f"loaded {run}/checkpoints/step_{stopped.group(1)}" in log  # the requeued job resumed from it
    assert "Traceback" not in log and "SIGKILL" not in log
    st = state(run)
    assert st["step"] == 4 and [h["step"] for h in st["history"]] == [1, 2, 3, 4]
    assert not (REPO / f".selfplay-stop-{job}").exists()


def test_a_dead_rank_ends_the_job_with_a_message_naming_it(warm_run, tmp_path):
    need_cluster()
    run = copy_run(warm_run, tmp_path)
    job = sbatch(run, "train.steps=40")
    wait_while(job, run, lambda: "rank 1 of 2" not in log_text(run) or "loaded" not in log_text(run))
    time.sleep(3)

    def env(pid: int) -> list[str]:
        try:
            return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return []

    rank1 = [
        pid
        for pid in map(
            int, subprocess.run(["pgrep", "-f", "selfplay train"], capture_output=True, text=True).stdout.split()
        )
        if {"RANK=1", f"SLURM_JOB_ID={job}"} <= set(env(pid))
    ]  # this job's rank 1 only
    assert rank1, "rank 1's process not found"
    os.kill(rank1[0], 9)
    t0 = time.time()
    assert wait_for(job, {"FAILED", "COMPLETED", "CANCELLED"}, 300) == "FAILED"
    assert time.time() - t0 < 300
    log = log_text(run)
    assert re.search(r"Root Cause.*?rank\s*:\s*1 ", log, re.DOTALL), log[-3000:]
    assert "finished with status" in log and "finished with status 0" not in log


def test_bad_submissions_fail_at_once(tmp_path):
    need_cluster()
    too_many = subprocess.run(
        ["sbatch", "--nodes=64", "slurm/selfplay.sh", "configs/smoke.yaml"], cwd=REPO, capture_output=True, text=True
    )
    assert too_many.returncode != 0 and "submission failed" in too_many.stderr  # EnforcePartLimits=ALL
    job = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path}/slurm-%j.out", "slurm/selfplay.sh", "configs/missing.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert wait_for(job, {"FAILED", "COMPLETED"}, 300) == "FAILED"
    assert "config file not found: configs/missing.yaml" in (tmp_path / f"slurm-{job}.out").read_text()
