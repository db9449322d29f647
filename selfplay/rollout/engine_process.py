"""A vLLM engine in a child process of its own (`ChildEngine`): the second agent's engine, since a process holds at
most one (selfplay/rollout/engine.py, docs/engines.md "One engine per process"). `vllm_engine`, registered as
`rollout.engine=vllm`, chooses between the two.

The parent keeps everything that needs the agent (sampling parameters, eos ids, grammar rows and the replay of their
allowed-token bits, decoding, the log-prob gap against the trainer: `ServedEngine`); the child, started with the
"spawn" method so that vLLM is imported there only, holds the `LLM` and answers requests over a Pipe:

    (n, "generate", prompts, params)  token-id prompts and plain-dict sampling parameters (grammar as EBNF text)
                                      -> per prompt {"tokens", "logprobs", "prompt_logprobs"?}
    (n, "sleep", level), (n, "wake_up")
    (n, "reload", folder)             weights from `folder`/model.safetensors, then the prefix cache emptied
    (n, "shutdown")

Requests are numbered: each answer is (number, "ok", result) or (number, "error", one line), and the parent drops an
answer to an earlier request whose caller was interrupted. The parent writes the weights to `rollout.sync_dir` (as
`rollout.sync=folder` does) for the child to reload, one tensor at a time as they are gathered (`write_weights`): the
parent holds one tensor beyond the file, never a copy of the model. A child that dies, or does not answer in time, is
reported as an `EngineError` naming the agent; the parent never waits on a dead one. The child is stopped when its
engine is closed, garbage-collected or the parent exits (multiprocessing's exit finalizers run before it joins its
children), and the child leaves by itself when the parent is gone (the Pipe closed, or its parent process changed).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.util
import os
import shutil
import signal
import threading
import time
from pathlib import Path

from selfplay.rollout.engine import (
    KEY,
    EngineError,
    ServedEngine,
    VLLMEngine,
    _one_line,
    generate_plain,
    llm_kwargs,
    model_runner,
    policy_weight_items,
    policy_weight_specs,
    require_vllm,
    write_weights,
)
from selfplay.rollout.engines import engine_name, register_engine
from selfplay.runtime.errors import UserError

START_TIMEOUT_S = 1800.0  # building the engine (a large model on a GPU compiles and captures graphs)
REQUEST_TIMEOUT_S = 3600.0  # one request (a rollout batch); a dead child is noticed within a second regardless
POLL_S = 1.0
# torchrun's variables: the child's engine is a lone one (world 1), not a rank of the trainer's group
RANK_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


@register_engine("vllm")
def vllm_engine(cfg, agent, folder: str | Path, *, rank: int = 0) -> ServedEngine:
    """`rollout.engine=vllm`: the agent's engine in this process (`VLLMEngine`), or, with both agents on vLLM, the
    generator's in a child process (`ChildEngine`): one engine per process (docs/engines.md)."""
    kwargs = dict(seed=cfg.run.seed + rank, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
    if agent.name == "generator" and engine_name(cfg.rollout, "solver") == "vllm":
        return ChildEngine(agent, folder, cfg.rollout, **kwargs)
    return VLLMEngine(agent, folder, cfg.rollout, **kwargs)


class ChildFailed(RuntimeError):
    """The child's answer was an error, or the child is gone (the message is one line)."""


class ChildEngine(ServedEngine):
    """One agent's vLLM engine in a child process, built from its Hugging Face folder `folder`."""

    sync_method = "folder"

    def __init__(
        self,
        agent,
        folder: str | Path,
        rcfg,
        *,
        seed: int = 0,
        dtype: str = "float32",
        trust_remote_code: bool = False,
        label: str = "",
        start_timeout: float = START_TIMEOUT_S,
    ):
        super().__init__(agent, rcfg, label)
        self.request_timeout = REQUEST_TIMEOUT_S
        self.seq = 0  # requests numbered, so that a late answer is never taken for the next one's (0: the start)
        kwargs = llm_kwargs(
            folder,
            rcfg,
            seed=seed,
            dtype=dtype,
            max_len=agent.max_positions,
            trust_remote_code=trust_remote_code,
            colocated=False,
        )
        probe = ([agent.eos_ids[0]], self._params(agent.sampling(max_new_tokens=1), 1))  # fails at start if it must
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        # not daemonic: vLLM or torch may start processes of their own in it; stopped by the finalizer below
        env = child_env(agent, rcfg, self.gpu)
        self.process = ctx.Process(
            target=serve, args=(child_conn, env, kwargs, probe), name=f"vllm-{self.label}", daemon=False
        )
        t0 = time.perf_counter()
        with child_environ(env):  # the child's environment from its first instruction (CUDA reads it once)
            self.process.start()
        child_conn.close()
        self.pid = self.process.pid
        self._finalizer = multiprocessing.util.Finalize(
            self, stop_child, (self.process, self.conn, self.sync_folder()), exitpriority=10
        )
        try:
            self.pid = self._receive(start_timeout, "start")
        except ChildFailed as exc:
            self.close()
            raise UserError(
                f"{KEY}=vllm cannot serve {folder} (the {self.label}'s engine process): {exc} (use {KEY}=hf)"
            ) from None
        self.start_s = time.perf_counter() - t0

    # ---- the protocol -----------------------------------------------------------------------------------
    def _receive(self, timeout: float, what: str, seq: int = 0):
        """The answer to request `seq`; answers to earlier requests (one whose caller was interrupted) are
        dropped."""
        t0 = time.monotonic()
        while True:
            if not self.conn.poll(POLL_S):
                if not self.process.is_alive():
                    raise ChildFailed(
                        f"its process {self.pid} exited (exit code {self.process.exitcode}) during {what}"
                    )
                if time.monotonic() - t0 > timeout:
                    self.close()
                    raise ChildFailed(f"its process {self.pid} gave no answer to {what} in {timeout:g} s; stopped")
                continue
            try:
                got, status, value = self.conn.recv()
            except (EOFError, OSError):
                self.process.join(5)
                raise ChildFailed(
                    f"its process {self.pid} exited (exit code {self.process.exitcode}) during {what}"
                ) from None
            if got == seq:
                break
        if status != "ok":
            raise ChildFailed(value)
        return value

    def call(self, op: str, *args, timeout: float | None = None):
        """One request to the child and its answer (ChildFailed: its error, or the child gone)."""
        if not self.process.is_alive():
            raise ChildFailed(f"its process {self.pid} is not running (exit code {self.process.exitcode})")
        self.seq += 1
        try:
            self.conn.send((self.seq, op, *args))
        except (OSError, ValueError) as exc:
            raise ChildFailed(f"its process {self.pid} cannot be reached ({_one_line(exc)})") from None
        return self._receive(self.request_timeout if timeout is None else timeout, op, self.seq)

    # ---- ServedEngine -----------------------------------------------------------------------------------
    def _generate(self, prompts, params):
        return self.call("generate", [list(p) for p in prompts], params)

    def _sleep(self) -> None:
        self._wrapped("sleep", 1)

    def _wake_up(self) -> None:
        self._wrapped("wake_up")

    def _wrapped(self, op: str, *args):
        try:
            return self.call(op, *args)
        except ChildFailed as exc:
            raise EngineError(f"the {self.label}'s vLLM engine failed: {exc}") from None

    def _push(self, agent) -> None:
        folder = self.sync_folder()
        items = policy_weight_items(agent)
        try:
            write_weights(items, policy_weight_specs(agent), folder)  # one tensor at a time into the file
            self.call("reload", str(folder))
        finally:
            for _ in items:  # what a failed write left unread: under ZeRO-3 every rank takes part in every gather
                pass
            # the engine holds the weights now: the copy would only take the sync folder's memory (/dev/shm)
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        """Stop the child (asked first, then killed); idempotent."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()


def stop_child(process, conn, folder: Path | None = None, grace_s: float = 10.0) -> None:
    """Ask the child to shut down, then kill it if it has not gone within `grace_s`; its sync folder removed."""
    try:
        if process.is_alive():
            conn.send((-1, "shutdown"))
            if conn.poll(grace_s):
                conn.recv()
    except (OSError, EOFError, ValueError):
        pass
    process.join(grace_s)
    if process.is_alive():
        process.kill()
        process.join(grace_s)
    conn.close()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def child_environ(env: dict):
    """This process's environment with `env` set and torchrun's variables removed, while a child is started."""
    saved = {k: os.environ.get(k) for k in (*env, *RANK_VARS)}
    for var in RANK_VARS:
        os.environ.pop(var, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def child_env(agent, rcfg, gpu: bool) -> dict:
    """Environment for the child's engine: in-process inside the child, its KV-cache space on CPU, and on a GPU
    the device of the agent's trainer (the child sees it as device 0)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if not gpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", f"{rcfg.kv_cache_gb:g}")
    else:
        import torch

        device = next(agent.module.parameters()).device
        index = device.index if device.type == "cuda" and device.index is not None else torch.cuda.current_device()
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        env["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else str(index)
    return env


# ---- the child --------------------------------------------------------------------------------------------
def serve(conn, env: dict, kwargs: dict, probe) -> None:
    """The child's main: build the engine, answer ("ready", pid), then requests until shutdown or the parent
    is gone."""
    for var in RANK_VARS:
        os.environ.pop(var, None)
    os.environ.update(env)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the parent stops it (a Ctrl-C or a scheduler's SIGTERM is its)
        signal.signal(sig, signal.SIG_IGN)
    parent = os.getppid()
    threading.Thread(target=_leave_with_parent, args=(parent,), daemon=True).start()
    try:
        vllm = require_vllm()
        llm = vllm.LLM(**kwargs)
        generate_plain(llm, [probe[0]], [probe[1]])
    except BaseException as exc:  # noqa: BLE001 - whatever stops the engine, in one line to the parent
        _send(conn, (0, "error", _one_line(exc)))
        _exit(0)
    _send(conn, (0, "ok", os.getpid()))
    handlers = {
        "generate": lambda prompts, params: generate_plain(llm, prompts, params),
        "sleep": lambda level: llm.sleep(level=level),
        "wake_up": lambda: llm.wake_up(),
        "reload": lambda folder: _reload(llm, folder),
    }
    while True:
        try:
            seq, op, *args = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if op == "shutdown":
            _send(conn, (seq, "ok", None))
            break
        try:
            _send(conn, (seq, "ok", handlers[op](*args)))
        except Exception as exc:  # noqa: BLE001 - one line back; the engine serves the next request
            _send(conn, (seq, "error", _one_line(exc)))
    _exit(0)


def _reload(llm, folder: str) -> None:
    model_runner(llm).reload_weights(weights_path=folder)
    llm.reset_prefix_cache()  # cached prompt KV was computed by the old weights


def _send(conn, message) -> None:
    try:
        conn.send(message)
    except (OSError, EOFError):
        _exit(1)


def _leave_with_parent(parent: int) -> None:
    while True:
        time.sleep(POLL_S)
        if os.getppid() != parent:
            _exit(1)


def _exit(code: int) -> None:
    """Leave at once: vLLM's and torch's threads may not let an interpreter shutdown finish."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
