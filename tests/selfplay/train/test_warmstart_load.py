"""The warm start's corpus and its generator examples are a function of the config and seed: not of the
interpreter's hash seed, nor of the machine's load. Every validity check runs its programs on the sandbox's CPU
clock (generator.validity.CLOCK), so a reference that waited for a CPU on a busy machine is not rejected as timed
out. Both builds here run under a wall-clock budget so tight (sandbox.timeout_s=0.05) that a wall-clock limit
drops a different few programs on every run, and one of them beside a CPU hog that this test starts (and always
ends)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

BUILD = """
import hashlib, json, sys, tempfile
from pathlib import Path

import sandbox
from generator.build import BuildConfig
from selfplay.data.corpus import Corpus
from selfplay.runtime.config import load_config
from selfplay.train.warmstart import generator_examples, warmstart_corpus

cfg = load_config("configs/smoke.yaml", sys.argv[1:])
with tempfile.TemporaryDirectory() as tmp, sandbox.open_sandbox(
    backend=cfg.sandbox.backend, workers=1, timeout_s=cfg.sandbox.timeout_s, cache=False
) as sb, Corpus(Path(tmp) / "corpus.sqlite") as corpus:
    tasks = warmstart_corpus(cfg, sb, corpus)
    pairs = generator_examples(
        tasks, cfg.train.references, cfg.run.seed, cfg.generator.format, sb, corpus, BuildConfig.from_config(cfg.tasks)
    )
digest = lambda x: hashlib.sha256(json.dumps(x, sort_keys=True).encode()).hexdigest()
print(json.dumps({"tasks": [t.id for t in tasks], "records": digest([t.to_dict() for t in tasks]),
                  "pairs": len(pairs), "pairs_digest": digest(pairs)}))
"""
OVERRIDES = ["warmstart.tasks=24", "sandbox.timeout_s=0.05"]


def _build(hash_seed: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", BUILD, *OVERRIDES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_warm_start_corpus_is_the_same_under_another_hash_seed_and_a_busy_machine():
    quiet = _build("1")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = _build("2")
    finally:
        hog.kill()
        hog.wait()
    assert len(quiet["tasks"]) == 24
    assert quiet["pairs"] > 0
    assert busy == quiet
