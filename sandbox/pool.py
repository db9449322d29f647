"""A pool of fork-server workers, each reached through one socket connection.

How a worker is started is a `WorkerLauncher`: `LocalLauncher` starts `forkserver.py` as a host process; the
Docker backend (sandbox/docker_backend.py) implements the same three methods for a container that runs the same
server on a socket in a bind-mounted folder. The pool only speaks the socket protocol documented at the top of
sandbox/forkserver.py, so it does not care where the server runs.

Requests are multiplexed over idle workers from the calling thread with `selectors` (no thread per run). A
worker whose connection breaks (the program killed it, or it crashed) is restarted transparently and the
request it was serving gets status "killed"; a worker that does not answer within the request's own time
budget plus a grace period is treated the same way but reported as "sandbox_error" (our fault).
"""

from __future__ import annotations

import os
import queue
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from sandbox import forkserver
from sandbox.errors import SandboxError, SandboxUnavailable

FORKSERVER_PATH = os.path.abspath(forkserver.__file__)
START_TIMEOUT_S = 30.0  # how long a worker may take to create its socket
META_KEYS = ("network_isolated", "user_isolated", "private_tmp", "ipc_isolated")  # from a worker's hello, into results
GRACE_S = 10.0  # beyond a request's own budget before a silent worker counts as hung


class WorkerLauncher(Protocol):
    """Starts one fork server somewhere and says where its socket is."""

    meta: dict  # merged into every result's meta (e.g. {"backend": "process"})

    def start(self) -> str:
        """Start the server; return the path of its unix socket once it exists. Raise SandboxUnavailable."""

    def alive(self) -> bool:
        """Whether the server (process / container) still runs."""

    def stop(self) -> None:
        """Stop the server and remove what start() created. Idempotent."""


def server_env() -> dict:
    """The environment a fork server starts with: nothing from the host but what Python needs.

    PYTHONHASHSEED is fixed so that every worker (and every run) iterates sets of strings in the same order:
    determinism checks compare runs that may land on different workers. LD_BIND_NOW makes the dynamic linker
    resolve every symbol when the server starts, not lazily on first call: otherwise each child resolves the
    ones the server never called, again, writing to its copy of the symbol tables (~10 copy-on-write faults and
    ~1 % of a program's CPU). The server drops it from the environment programs get.
    """
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "LD_BIND_NOW": "1",
    }


class LocalLauncher:
    """A fork server as a host process (the "process" backend)."""

    def __init__(
        self,
        index: int,
        *,
        python: str | None = None,
        isolate_user: bool = True,
        run_as: int | None = None,
        extra_args: tuple = (),
    ):
        """python: the interpreter for the server (default: this one); isolate_user: give children a uid of
        their own (root only); run_as: start the server itself under this uid (root only; e.g. to use the
        unprivileged user-namespace path); extra_args: more forkserver.py options."""
        self.index = index
        self.python = python or sys.executable
        self.run_as = run_as
        self.extra_args = (["--uid", "auto"] if isolate_user and run_as is None else []) + list(extra_args)
        self.meta = {"backend": "process"}
        self.proc: subprocess.Popen | None = None
        self.dir: str | None = None

    def start(self) -> str:
        self.stop()
        self.dir = tempfile.mkdtemp(prefix=f"sandbox-w{self.index}-")
        path = os.path.join(self.dir, "worker.sock")
        log = open(os.path.join(self.dir, "server.log"), "wb")
        args = [self.python, "-I", "-S", FORKSERVER_PATH, "--socket", path, "--work-dir", self.dir, *self.extra_args]
        who: dict[str, Any] = {}
        if self.run_as is not None:
            os.chown(self.dir, self.run_as, self.run_as)
            who = {"user": self.run_as, "group": self.run_as, "extra_groups": []}
        with log:
            self.proc = subprocess.Popen(
                args,
                env=server_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
                cwd=self.dir,
                **who,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(self.dir, "server.log"), "rb") as f:
                    tail = f.read()[-2000:].decode(errors="replace")
                self.stop()
                raise SandboxUnavailable(
                    f"sandbox worker {self.index} did not start; check that "
                    f"`{self.python} {FORKSERVER_PATH} --socket /tmp/x.sock` runs: {tail}"
                )
            time.sleep(0.002)
        return path

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            # a server that was killed could not remove its cgroup (forkserver.WorkerCgroup): it goes once the
            # last process of its pid namespace has (they die with the namespace's init, which dies with it)
            forkserver.remove_cgroup_dirs(forkserver.worker_cgroup_dirs(self.proc.pid))
            self.proc = None
        if self.dir is not None:
            forkserver.remove_tree(self.dir)  # iterative: a program's 1,200-deep tree cannot make it raise
            self.dir = None


class Worker:
    """One connection to one fork server, restarted through its launcher when it breaks."""

    def __init__(self, launcher: WorkerLauncher):
        self.launcher = launcher
        self.sock: socket.socket | None = None
        self.info: dict = {}
        self.restarts = 0

    def start(self) -> None:
        self.close()
        path = self.launcher.start()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(START_TIMEOUT_S)
        try:
            sock.connect(path)
            forkserver.send_frame(sock, {"op": "hello"})
            self.info = forkserver.recv_frame(sock)
        except (OSError, EOFError, ValueError) as exc:
            sock.close()
            self.launcher.stop()
            raise SandboxUnavailable(f"sandbox worker did not answer on {path}: {exc}") from exc
        self.sock = sock

    def restart(self) -> None:
        self.restarts += 1
        self.start()

    def request(self, req: dict, timeout: float) -> dict:
        """Send one request and wait for its response (raises OSError/EOFError/ValueError when broken)."""
        self.send(req)
        return self.receive(timeout)

    def connected(self) -> socket.socket:
        """The socket to the server; ConnectionError when a restart failed earlier (the caller tries again)."""
        if self.sock is None:
            raise ConnectionError("sandbox worker is not running")
        return self.sock

    def send(self, req: dict) -> None:
        sock = self.connected()
        sock.settimeout(GRACE_S)
        forkserver.send_frame(sock, req)

    def receive(self, timeout: float) -> dict:
        sock = self.connected()
        sock.settimeout(timeout)
        return forkserver.recv_frame(sock, RESPONSE_DEPTH)

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
        self.launcher.stop()


RESPONSE_DEPTH = forkserver.MAX_DEPTH + 8  # a response nests answers a few levels down ({"tests": [{"output":..}]})


def budget_s(req: dict) -> float:
    """The longest a server may legitimately take for a request."""
    return forkserver.wall_budget_s(req) + GRACE_S


def _failure(req: dict, status: str, message: str, meta: dict) -> dict:
    resp = {"status": status, "stdout": "", "stderr": message, "duration_s": 0.0, "meta": meta}
    if req.get("op") == "tests":
        resp["tests"] = [
            {"status": status, "output": None, "error": message, "duration_s": 0.0, "calls": None}
            for _ in req["inputs"]
        ]
    return resp


class Pool:
    """Workers behind one `execute(requests) -> responses` call, safe to use from several threads."""

    def __init__(self, launchers: Sequence[WorkerLauncher]):
        self.workers = [Worker(launcher) for launcher in launchers]
        self.idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        started: list[Worker] = []
        try:
            for w in self.workers:
                w.start()
                started.append(w)
        except BaseException:
            for w in started:
                w.close()
            raise
        for w in self.workers:
            self.idle.put(w)

    def _acquire(self, n: int) -> list[Worker]:
        got = [self.idle.get()]  # block for one
        while len(got) < n:
            try:
                got.append(self.idle.get_nowait())
            except queue.Empty:
                break
        return got

    def _broken(self, w: Worker, req: dict, exc: BaseException, hung: bool) -> dict:
        """The worker's connection broke or it hung: restart it and blame the program (or us, if hung)."""
        meta = {**w.launcher.meta, **{k: w.info[k] for k in META_KEYS if k in w.info}, "worker_restarted": True}
        if self._closed:  # closed under our feet: do not start servers nobody will stop
            return _failure(req, "sandbox_error", "the sandbox was closed during the run", meta)
        try:
            w.restart()
        except SandboxUnavailable as exc2:
            return _failure(req, "sandbox_error", f"sandbox worker could not be restarted: {exc2}", meta)
        if hung:
            return _failure(req, "sandbox_error", f"sandbox worker stopped answering ({exc}); restarted", meta)
        return _failure(req, "killed", "the program killed its sandbox worker; the worker was restarted", meta)

    def execute(self, reqs: list[dict]) -> list[dict]:
        """Run requests over idle workers; responses in input order. Never raises for a program's doing."""
        if self._closed:
            raise SandboxError("the sandbox is closed; open a new one with sandbox.open_sandbox()")
        results: list[dict | None] = [None] * len(reqs)
        if not reqs:
            return []
        workers = self._acquire(len(reqs))
        try:
            if len(workers) == 1 or len(reqs) == 1:
                self._serial(workers[0], reqs, results)
            else:
                self._multiplex(workers, reqs, results)
        finally:
            for w in workers:
                self.idle.put(w)
        return results  # type: ignore[return-value]

    def _down(self, w: Worker, req: dict) -> dict | None:
        """A worker whose last restart failed gets another try before its next request; None when it runs."""
        if w.sock is not None:
            return None
        try:
            w.restart()
            return None
        except SandboxUnavailable as exc:
            meta = {**w.launcher.meta, "worker_restarted": True}
            return _failure(req, "sandbox_error", f"sandbox worker could not be restarted: {exc}", meta)

    def _one(self, w: Worker, req: dict) -> dict:
        down = self._down(w, req)
        if down is not None:
            return down
        try:
            resp = w.request(req, budget_s(req))
        except TimeoutError as exc:
            return self._broken(w, req, exc, hung=True)
        except (OSError, EOFError, ValueError) as exc:
            return self._broken(w, req, exc, hung=False)
        return self._received(w, resp)

    def _received(self, w: Worker, resp: dict) -> dict:
        """A response: stamped with the worker's facts; a server that asked to be replaced (it could not clean up
        after the program, or failed itself) is, now, so the next program starts on a fresh one."""
        why = resp.pop("recycle", None)
        if why:
            self._replace(w)
        resp = self._stamp(w, resp)
        if why:
            resp["meta"]["worker_recycled"] = str(why)[:300]
        return resp

    def _replace(self, w: Worker) -> None:
        try:
            w.restart()
        except SandboxUnavailable:
            w.close()  # _down tries again before its next request

    def _stamp(self, w: Worker, resp: dict) -> dict:
        resp["meta"] = {**w.launcher.meta, **resp.get("meta", {})}
        return resp

    def _serial(self, w: Worker, reqs: list[dict], results: list) -> None:
        for i, req in enumerate(reqs):
            results[i] = self._one(w, req)

    def _multiplex(self, workers: list[Worker], reqs: list[dict], results: list) -> None:
        pending = list(range(len(reqs)))[::-1]
        free = list(workers)
        busy: dict[Worker, tuple[int, float]] = {}
        sel = selectors.DefaultSelector()
        try:
            while pending or busy:
                while pending and free:
                    w = free.pop()
                    i = pending.pop()
                    down = self._down(w, reqs[i])
                    if down is not None:
                        results[i] = down
                        free.append(w)
                        continue
                    try:
                        w.send(reqs[i])
                    except (OSError, ValueError) as exc:
                        results[i] = self._broken(w, reqs[i], exc, hung=False)
                        free.append(w)
                        continue
                    busy[w] = (i, time.monotonic() + budget_s(reqs[i]))
                    sel.register(w.connected(), selectors.EVENT_READ, w)
                if not busy:
                    continue
                wait = max(0.0, min(d for _, d in busy.values()) - time.monotonic())
                for key, _ in sel.select(wait):
                    w = key.data
                    i, _ = busy.pop(w)
                    sel.unregister(w.sock)
                    try:
                        results[i] = self._received(w, w.receive(GRACE_S))
                    except TimeoutError as exc:
                        results[i] = self._broken(w, reqs[i], exc, hung=True)
                    except (OSError, EOFError, ValueError) as exc:
                        results[i] = self._broken(w, reqs[i], exc, hung=False)
                    free.append(w)
                now = time.monotonic()
                for w, (i, deadline) in list(busy.items()):
                    if now > deadline:
                        busy.pop(w)
                        sel.unregister(w.connected())
                        results[i] = self._broken(w, reqs[i], TimeoutError("no answer"), hung=True)
                        free.append(w)
        finally:
            sel.close()

    def health(self) -> list[dict]:
        """Per worker: alive, restarts, and what the last program left behind (work dirs, child processes).
        Waits until every worker is idle."""
        workers = [self.idle.get() for _ in self.workers]
        try:
            out = []
            for w in workers:
                try:
                    stats = w.request({"op": "stats"}, GRACE_S)
                except (OSError, EOFError, ValueError):
                    stats = {"ok": False}
                out.append(
                    {
                        "alive": w.launcher.alive() and bool(stats.get("ok")),
                        "restarts": w.restarts,
                        "workdirs": stats.get("workdirs"),
                        "children": stats.get("children"),
                        "ready": stats.get("ready"),
                        "fds": stats.get("fds"),
                        "cgroup_procs": stats.get("cgroup_procs"),
                        "info": dict(w.info),
                    }
                )
            return out
        finally:
            for w in workers:
                self.idle.put(w)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for w in self.workers:
            w.close()
