"""Content-addressed result cache: the same program on the same inputs under the same limits runs once.

Self-play grades the same code over and over (k samples of a task often coincide, the generator's reference is
re-run by several checks, multi-turn episodes resubmit unchanged solutions). A result is addressed by

    sha256(version, kind, normalised code, canonical JSON of the payload, canonical JSON of the limits)

- *version*: `SANDBOX_VERSION` plus the Python minor version. Bump `SANDBOX_VERSION` whenever anything that can
  change a program's result changes (the child runner, output normalisation, status rules); old entries then
  simply stop matching.
- *normalised code*: `ast.dump(ast.parse(source))`, so formatting and comments do not matter; the raw text when it
  does not parse (a syntax error is still a deterministic result). Consequence, by design: a hit for a program
  that differs only in layout returns the first program's stdout/stderr, whose traceback line numbers may differ.
  Programs that read their own source text or line numbers are the (documented) exception to "same AST, same result".
- *payload*: whatever else the child receives (entry point, test inputs) — JSON values only.
- *limits*: everything about the environment that can change the outcome (timeout, memory, output caps, backend).

Storage: an in-process LRU (bounded by `max_items` and `max_bytes`) in front of an optional SQLite file (WAL mode,
busy timeout, bounded by `max_disk_items` and `max_disk_bytes`), which several processes — workers of several
ranks — may share. A result larger than `max_entry_bytes` is not stored (a wrong program's many large outputs cost
a re-run, never the cache's memory or disk): every bound is in bytes as well as entries. Values are stored as JSON,
so a `get` always returns a fresh dict (callers cannot corrupt the cache by mutating a result) with
`"cached": True`.

What is cached (`put`'s rule): only deterministic outcomes, i.e. results whose `status` is in `CACHEABLE_STATUSES` (ok
/ error / timeout / memory / output_limit) and none of whose per-test outcomes (`value["tests"]`, for test reports) is
"killed" or "sandbox_error". "killed" and "sandbox_error" may be the pool's doing (a recycled worker, a crash of our
own code), so they are never stored. No stored status is the program's choice: every status is what the server
observed (docs/sandbox.md), so a cached verdict is one a fresh run of the same program gives. Timeouts are cached
under the limits in the key (a caller on an overloaded machine that distrusts its timeouts should not `put` them).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import sqlite3
import statistics
import sys
import threading
import time
import warnings
from collections import OrderedDict
from typing import Any

from sandbox.files import owner_file

SANDBOX_VERSION = "sandbox-3"  # bump when a program's result could change for the same code, inputs and limits
# sandbox-2: statuses only from what the server observed (an exit before the end is never "ok"), parent-measured
# durations, exact integer comparison, trusted checks
# sandbox-3: a call record with a gap (the profile function dropped) is sent as none; a trusted check takes only
# the entry point (never a builtin's name) from the module and runs the prompt's helpers itself
KEY_VERSION = f"{SANDBOX_VERSION}/py{sys.version_info[0]}.{sys.version_info[1]}"  # ast.dump differs by version
CACHEABLE_STATUSES = frozenset({"ok", "error", "timeout", "memory", "output_limit"})
UNCACHEABLE_TEST_STATUSES = frozenset({"killed", "sandbox_error"})  # per-test outcomes that may be our fault
_PRUNE_EVERY = 1000  # on-disk puts between two prunes to max_disk_items / max_disk_bytes
MAX_ENTRY_BYTES = 1 << 20  # default largest stored result (UTF-8 JSON bytes)
MAX_BYTES = 256 << 20  # default bytes of results kept in memory
MAX_DISK_BYTES = 2 << 30  # default bytes of results kept on disk (approximately: pruned every so often)


class CacheError(ValueError):
    """A cache key or value that is not what the cache accepts (e.g. a non-JSON payload)."""


def canonical_json(value: Any, what: str = "value") -> str:
    """Sorted-key, compact JSON: equal JSON values give equal text (tuples count as lists)."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise CacheError(f"cache {what} must be JSON values only: {exc}") from None


@functools.lru_cache(maxsize=8192)
def code_digest(source: str) -> str:
    """sha256 of the normalised code: its AST dump, or the raw text when it does not parse.

    Memoised on the text, so looking up a program seen before costs a hash of the string, not a parse."""
    if not isinstance(source, str):
        raise CacheError(f"program source must be a str, got {type(source).__name__}")
    try:
        text = "ast:" + ast.dump(ast.parse(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: NUL bytes
        text = "raw:" + source
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def cache_key(kind: str, source: str, payload: Any = None, limits: dict | None = None) -> str:
    """The content address of one execution (see the module docstring for what goes in)."""
    if not isinstance(kind, str) or not kind:
        raise CacheError(f"cache kind must be a non-empty str, got {kind!r}")
    parts = [
        KEY_VERSION,
        kind,
        code_digest(source),
        canonical_json(payload, "payload"),
        canonical_json(limits or {}, "limits"),
    ]
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def is_cacheable(value: dict) -> bool:
    """`put`'s rule: a deterministic outcome (see the module docstring)."""
    if value.get("status") not in CACHEABLE_STATUSES:
        return False
    tests = value.get("tests") or []
    return not any(isinstance(t, dict) and t.get("status") in UNCACHEABLE_TEST_STATUSES for t in tests)


class ResultCache:
    """LRU in memory, optionally backed by a shared SQLite file. Thread-safe; fork-safe (reconnects per process).

    Args:
        path: SQLite file shared by processes; None or "" = memory only.
        max_items: entries kept in the in-memory LRU.
        max_disk_items: entries kept on disk (the oldest are pruned, approximately, every 1000 puts); None = no bound.
        max_entry_bytes: a result whose JSON exceeds this many bytes is not stored (`skipped`).
        max_bytes: bytes of results kept in the in-memory LRU.
        max_disk_bytes: bytes of results kept on disk: the oldest are pruned every 1000 puts or after
            max_disk_bytes / 16 bytes of puts by this process, so the file holds at most about 1/16 more (plus
            SQLite's overhead and what other processes sharing the file added since their last prune).
    """

    def __init__(
        self,
        path: str | None = None,
        max_items: int = 100_000,
        max_disk_items: int | None = 1_000_000,
        *,
        max_entry_bytes: int = MAX_ENTRY_BYTES,
        max_bytes: int = MAX_BYTES,
        max_disk_bytes: int = MAX_DISK_BYTES,
    ):
        for name, v in (
            ("max_entry_bytes", max_entry_bytes),
            ("max_bytes", max_bytes),
            ("max_disk_bytes", max_disk_bytes),
        ):
            if not isinstance(v, int) or v < 1:
                raise CacheError(f"{name} must be a positive int, got {v!r}")
        self.max_entry_bytes, self.max_bytes, self.max_disk_bytes = max_entry_bytes, max_bytes, max_disk_bytes
        self._mem_bytes = 0
        self._bytes_since_prune = 0
        if not isinstance(max_items, int) or max_items < 1:
            raise CacheError(f"max_items must be a positive int, got {max_items!r}")
        if max_disk_items is not None and (not isinstance(max_disk_items, int) or max_disk_items < 1):
            raise CacheError(f"max_disk_items must be a positive int or None, got {max_disk_items!r}")
        self.path = os.fspath(path) if path else None
        self.max_items = max_items
        self.max_disk_items = max_disk_items
        self._mem: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._conn_pid = -1
        self._puts_since_prune = 0
        self._warned = False
        self.hits = self.misses = self.puts = self.skipped = self.disk_errors = 0
        if self.path:
            self._db()  # open now: a bad path fails at construction with a clear message

    key = staticmethod(cache_key)

    # -- storage -----------------------------------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        """The disk level's connection, one per process (called only where the cache has a path)."""
        path = self.path
        if path is None:
            raise CacheError("this result cache has no disk level (no path)")
        if self._conn is None or self._conn_pid != os.getpid():  # a forked child must not reuse the parent's handle
            try:
                if path != ":memory:":
                    owner_file(path, sqlite=True)  # expected outputs: never readable by a sandboxed program
                conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value TEXT NOT NULL,"
                    " created REAL NOT NULL)"
                )
            except (sqlite3.Error, OSError) as exc:
                raise CacheError(f"cannot open the result cache {self.path!r}: {exc}") from None
            self._conn, self._conn_pid = conn, os.getpid()
        return self._conn

    def _disk_failed(self, exc: Exception) -> None:
        # The cache only saves time: a locked or full disk must not stop training. Count it, warn once.
        self.disk_errors += 1
        if not self._warned:
            self._warned = True
            warnings.warn(f"result cache {self.path!r}: {exc} (continuing without it for this entry)", stacklevel=3)

    def _remember(self, key: str, text: str) -> None:
        old = self._mem.pop(key, None)
        if old is not None:
            self._mem_bytes -= _size(old)
        self._mem[key] = text
        self._mem_bytes += _size(text)
        while len(self._mem) > self.max_items or (self._mem_bytes > self.max_bytes and len(self._mem) > 1):
            self._mem_bytes -= _size(self._mem.popitem(last=False)[1])
        if self._mem_bytes > self.max_bytes:  # a single entry over the memory bound: keep nothing
            self._mem.clear()
            self._mem_bytes = 0

    @property
    def memory_bytes(self) -> int:
        """Bytes of results held in memory (UTF-8 JSON)."""
        return self._mem_bytes

    def disk_bytes(self) -> int:
        """Bytes of results stored on disk (0 without a file)."""
        if not self.path:
            return 0
        with self._lock:
            return int(
                self._db().execute("SELECT COALESCE(SUM(LENGTH(CAST(value AS BLOB))), 0) FROM results").fetchone()[0]
            )

    def _prune(self, db: sqlite3.Connection) -> None:
        """Drop the oldest entries beyond max_disk_items, then beyond max_disk_bytes."""
        if self.max_disk_items:
            db.execute(
                "DELETE FROM results WHERE rowid <= (SELECT MAX(rowid) FROM results) - ?", (self.max_disk_items,)
            )
        total = db.execute("SELECT COALESCE(SUM(LENGTH(CAST(value AS BLOB))), 0) FROM results").fetchone()[0]
        excess = int(total) - self.max_disk_bytes
        if excess <= 0:
            return
        cutoff = None
        for rowid, size in db.execute("SELECT rowid, LENGTH(CAST(value AS BLOB)) FROM results ORDER BY rowid"):
            excess -= size
            cutoff = rowid
            if excess <= 0:
                break
        if cutoff is not None:
            db.execute("DELETE FROM results WHERE rowid <= ?", (cutoff,))

    def get(self, key: str) -> dict | None:
        """The stored result with `"cached": True`, or None."""
        with self._lock:
            text = self._mem.get(key)
            if text is not None:
                self._mem.move_to_end(key)
            elif self.path:
                try:
                    row = self._db().execute("SELECT value FROM results WHERE key = ?", (key,)).fetchone()
                except sqlite3.Error as exc:
                    self._disk_failed(exc)
                    row = None
                if row is not None:
                    text = row[0]
                    self._remember(key, text)
            if text is None:
                self.misses += 1
                return None
            self.hits += 1
        value = json.loads(text)
        value["cached"] = True
        return value

    def put(self, key: str, value: dict) -> bool:
        """Store `value` if it is a deterministic outcome (`is_cacheable`); returns whether it was stored."""
        if not isinstance(value, dict):
            raise CacheError(f"cache values are dicts (ExecResult.to_dict()), got {type(value).__name__}")
        if not is_cacheable(value):
            with self._lock:
                self.skipped += 1
            return False
        text = canonical_json({**value, "cached": False}, "value")
        if _size(text) > self.max_entry_bytes:
            with self._lock:
                self.skipped += 1
            return False
        with self._lock:
            self.puts += 1
            self._remember(key, text)
            if self.path:
                try:
                    db = self._db()
                    db.execute(
                        "INSERT OR REPLACE INTO results (key, value, created) VALUES (?, ?, ?)",
                        (key, text, time.time()),
                    )
                    self._puts_since_prune += 1
                    self._bytes_since_prune += _size(text)
                    if self._puts_since_prune >= _PRUNE_EVERY or self._bytes_since_prune > self.max_disk_bytes // 16:
                        self._puts_since_prune = self._bytes_since_prune = 0
                        self._prune(db)
                except sqlite3.Error as exc:
                    self._disk_failed(exc)
        return True

    def __len__(self) -> int:
        return len(self._mem)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._conn_pid == os.getpid():
                self._conn.close()
            self._conn = None

    # -- stats -------------------------------------------------------------------------------------------------
    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def stats(self) -> dict:
        """Counters since construction; `hit_rate` feeds the `sandbox/cache_hit_rate` TensorBoard tag."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hit_rate,
            "puts": self.puts,
            "skipped": self.skipped,
            "disk_errors": self.disk_errors,
            "items": len(self._mem),
        }


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def measure_hit_cost(sb, source: str, n: int = 50) -> dict:
    """Print and return what a cache hit costs next to running `source` fresh (benchmarks call this; no asserts).

    - fresh_ms: median `sb.run` of `source` made unique per call (an extra assignment), so never a hit;
    - lookup_us: median key + get on a ResultCache holding the result (the cost the cache adds to a hit);
    - api_hit_ms: median `sb.run(source)` repeated, i.e. a hit through the whole API when `sb` caches.
    """
    fresh = []
    for i in range(n):
        t0 = time.perf_counter()
        sb.run(f"{source}\n__cache_probe__ = {i}\n")
        fresh.append(time.perf_counter() - t0)
    first = sb.run(source)
    cache = ResultCache()
    limits = {"probe": True}
    cache.put(cache.key("run", source, None, limits), first.to_dict())
    lookups = []
    for _ in range(n):
        t0 = time.perf_counter()
        hit = cache.get(cache.key("run", source, None, limits))
        lookups.append(time.perf_counter() - t0)
    api = []
    for _ in range(n):
        t0 = time.perf_counter()
        again = sb.run(source)
        api.append(time.perf_counter() - t0)
    out = {
        "n": n,
        "status": first.status,
        "fresh_ms": 1e3 * statistics.median(fresh),
        "lookup_us": 1e6 * statistics.median(lookups),
        "api_hit_ms": 1e3 * statistics.median(api),
        "api_hit_cached": bool(getattr(again, "cached", False)),
        "lookup_hit": hit is not None,
    }
    out["lookup_ratio"] = out["lookup_us"] / 1e3 / out["fresh_ms"]
    out["api_hit_ratio"] = out["api_hit_ms"] / out["fresh_ms"]
    print(
        f"cache hit cost: fresh run {out['fresh_ms']:.3f} ms, lookup {out['lookup_us']:.1f} us "
        f"({100 * out['lookup_ratio']:.2f}% of a run), hit through sb.run {out['api_hit_ms']:.3f} ms "
        f"({100 * out['api_hit_ratio']:.2f}%, cached={out['api_hit_cached']})"
    )
    return out
