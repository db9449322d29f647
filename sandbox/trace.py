"""Execution traces: an append-only JSONL log of every execution, for failure analysis.

One line per execution:
    {"time": unix seconds, "pid": writer, "kind": "run" | "tests" | ..., "code_sha256": sha256 of the raw source,
     "status": ExecResult/TestReport status, "duration_s": float, "cached": bool,
     "stdout": capped text, "stderr": capped text, "error_type": "ValueError" | null,
     "tests": {"passed": int, "total": int, "by_status": {...}} (test reports only)}

Several processes (workers, ranks) may append to one file: it is opened with O_APPEND and each record is written
with a single `os.write`, so on a local filesystem lines never interleave (each write lands whole at the end of
the file). Network filesystems (NFS) do not guarantee this: give each rank its own file there.
`read_trace` skips a line that does not parse (e.g. a disk that filled up mid-write) and `summarize` counts them.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import statistics
import threading
import time
from typing import Any

from sandbox.files import FILE_MODE, owner_dir

DEFAULT_MAX_OUTPUT = 2000  # characters of stdout/stderr kept per record (the tail: that is where tracebacks are)
# "ZeroDivisionError: division by zero", "mod.CustomError: ...", a bare "KeyboardInterrupt" on its own line
_EXC_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Z]\w*)(?::|$)")


class TraceError(ValueError):
    """A trace file that cannot be written or read."""


def error_type(text: str | None) -> str | None:
    """The exception type named by the last line of a traceback or a short "ExcType: message" string."""
    if not text:
        return None
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line:
            continue
        m = _EXC_LINE.match(line)
        return m.group(1) if m else None
    return None


def _cap(text: Any, limit: int) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else "...[capped]" + text[-limit:]


class TraceLog:
    """Appends one JSON line per execution to `path` (created with its folders if missing)."""

    def __init__(self, path: str, max_output: int = DEFAULT_MAX_OUTPUT):
        if not path:
            raise TraceError("trace path is empty: pass a file path (e.g. RUN_DIR/sandbox_trace.jsonl)")
        self.path = os.fspath(path)
        self.max_output = max_output
        self._fd = -1
        self._pid = -1
        self._lock = threading.Lock()
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            owner_dir(folder)
            self._open()
        except OSError as exc:
            raise TraceError(f"cannot open the trace file {self.path!r}: {exc.strerror}") from None

    def _open(self) -> int:
        if self._fd < 0 or self._pid != os.getpid():  # after fork, open our own descriptor
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
            self._pid = os.getpid()
        return self._fd

    def entry(self, kind: str, source: str, result: dict) -> dict:
        """The record `record` writes (exposed for tests and for callers that batch)."""
        tests = result.get("tests")
        rec = {
            "time": time.time(),
            "pid": os.getpid(),
            "kind": kind,
            "code_sha256": hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest(),
            "status": result.get("status"),
            "duration_s": result.get("duration_s"),
            "cached": bool(result.get("cached", False)),
            "stdout": _cap(result.get("stdout"), self.max_output),
            "stderr": _cap(result.get("stderr"), self.max_output),
            "error_type": error_type(result.get("stderr")) if result.get("status") == "error" else None,
        }
        if isinstance(tests, list):
            by_status = collections.Counter(t.get("status") for t in tests)
            errors = collections.Counter(error_type(t.get("error")) for t in tests if t.get("error"))
            rec["tests"] = {
                "passed": sum(1 for t in tests if t.get("passed")),
                "total": len(tests),
                "by_status": dict(by_status),
                "error_types": {k: v for k, v in errors.items() if k},
            }
        return rec

    def record(self, kind: str, source: str, result: dict) -> None:
        """Append one execution (`result` is ExecResult.to_dict() or TestReport.to_dict())."""
        line = (json.dumps(self.entry(kind, source, result), ensure_ascii=False) + "\n").encode("utf-8", "replace")
        with self._lock:
            fd = self._open()
            written = os.write(fd, line)  # one write per line: O_APPEND keeps concurrent lines whole
            if written != len(line):  # only on a full disk; finish the line rather than leave it torn
                os.write(fd, line[written:])

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0 and self._pid == os.getpid():
                os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> TraceLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read(path: str) -> tuple[list[dict], int]:
    if not os.path.isfile(path):
        raise TraceError(f"trace file not found: {path}")
    records, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(rec, dict):
                records.append(rec)
            else:
                bad += 1
    return records, bad


def read_trace(path: str) -> list[dict]:
    """All records of a trace file, in file order (lines that do not parse are skipped)."""
    return _read(path)[0]


def summarize(path: str, top: int = 10) -> dict:
    """Counts by status and kind, cache share, median duration of fresh runs, most common error types."""
    records, bad = _read(path)
    errors: collections.Counter = collections.Counter()
    for rec in records:
        if rec.get("error_type"):
            errors[rec["error_type"]] += 1
        for name, count in ((rec.get("tests") or {}).get("error_types") or {}).items():
            errors[name] += count
    fresh = [r["duration_s"] for r in records if not r.get("cached") and isinstance(r.get("duration_s"), (int, float))]
    return {
        "records": len(records),
        "malformed_lines": bad,
        "by_status": dict(collections.Counter(r.get("status") for r in records)),
        "by_kind": dict(collections.Counter(r.get("kind") for r in records)),
        "cached": sum(1 for r in records if r.get("cached")),
        "median_duration_s": statistics.median(fresh) if fresh else None,
        "top_error_types": errors.most_common(top),
        "distinct_programs": len({r.get("code_sha256") for r in records}),
    }
