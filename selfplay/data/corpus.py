"""The task corpus: an append-only SQLite store (WAL) of task records with provenance.

    with Corpus("runs/x/corpus.sqlite") as corpus:
        corpus.insert(task)                          # InsertResult: inserted, or the duplicate it matched
        corpus.query(split="train", level=2, min_difficulty=0.2, limit=64)
        corpus.update_difficulty(task_id, solve_rate=0.25, n_samples=8, step=120)

Tables
    tasks              one row per task, never updated or deleted (triggers refuse it): the record JSON plus
                       indexed columns (family, source, split, level, created_step, generator_checkpoint,
                       ast_hash, behaviour_hash). Dedup on insert by id, normalised-AST hash and behaviour hash.
    difficulty         append-only history of measured solve rates (task_id, solve_rate, difficulty, n, step)
    difficulty_latest  the newest difficulty per task (an upsert, in the same transaction as its history row);
                       `Task.difficulty` read from the corpus comes from here. The record itself is never touched.
    reserved           fingerprints of tasks kept out of the corpus (the run's held-out evaluation tasks): a task
                       with the same id, program or behaviour is a duplicate, so no training task repeats them.
Every write is one transaction (`BEGIN IMMEDIATE ... COMMIT`), so a writer killed with SIGKILL loses no
committed row and leaves no half row; WAL lets readers read while a writer writes.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from generator.schema import SchemaError, Task
from sandbox.files import owner_dir, owner_file
from selfplay.runtime.errors import UserError
from selfplay.runtime.paths import CORPUS as CORPUS_FILE
from selfplay.runtime.paths import RunPaths

CORPUS_SCHEMA_VERSION = 2  # 2: the `reserved` table

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    family TEXT NOT NULL,
    source TEXT NOT NULL,
    split TEXT NOT NULL,
    level INTEGER NOT NULL,
    created_step INTEGER NOT NULL,
    generator_checkpoint TEXT,
    parent_ids TEXT NOT NULL,
    ast_hash TEXT,
    behaviour_hash TEXT,
    inserted_at REAL NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_split ON tasks(split, level);
CREATE INDEX IF NOT EXISTS tasks_family ON tasks(family);
CREATE INDEX IF NOT EXISTS tasks_source ON tasks(source);
CREATE INDEX IF NOT EXISTS tasks_ast ON tasks(ast_hash);
CREATE INDEX IF NOT EXISTS tasks_behaviour ON tasks(behaviour_hash);
CREATE TRIGGER IF NOT EXISTS tasks_append_only_u BEFORE UPDATE ON tasks
    BEGIN SELECT RAISE(ABORT, 'tasks are append-only'); END;
CREATE TRIGGER IF NOT EXISTS tasks_append_only_d BEFORE DELETE ON tasks
    BEGIN SELECT RAISE(ABORT, 'tasks are append-only'); END;
CREATE TABLE IF NOT EXISTS difficulty (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    solve_rate REAL,
    difficulty REAL NOT NULL,
    n_samples INTEGER,
    step INTEGER,
    recorded_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS difficulty_task ON difficulty(task_id);
CREATE TABLE IF NOT EXISTS difficulty_latest (
    task_id TEXT PRIMARY KEY,
    difficulty REAL NOT NULL,
    seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS difficulty_latest_value ON difficulty_latest(difficulty);
"""
_RESERVED_DDL = """
CREATE TABLE IF NOT EXISTS reserved (
    id TEXT PRIMARY KEY,
    ast_hash TEXT,
    behaviour_hash TEXT,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS reserved_ast ON reserved(ast_hash);
CREATE INDEX IF NOT EXISTS reserved_behaviour ON reserved(behaviour_hash);
"""
_DDL += _RESERVED_DDL
_MIGRATIONS = {1: _RESERVED_DDL}  # schema version -> DDL that brings it to the next version


class CorpusError(Exception):
    """A corpus that cannot be opened or used as asked. The message names the file or the bad value."""


@dataclass(frozen=True)
class InsertResult:
    inserted: bool
    duplicate_of: str | None = None  # id of the stored task it duplicates
    reason: str = ""  # "same id" | "same program" | "same behaviour"


FILTERS = ("split", "family", "level", "source")


DEDUP_TABLES = (("tasks", ""), ("reserved", "reserved: "))  # (table, prefix of the reason a duplicate gets)


class Corpus:
    """One connection to a corpus file. Use from one thread; open one per process/thread."""

    def __init__(
        self, path: str | Path, *, create: bool = True, timeout_s: float = 30.0, synchronous: str = "NORMAL"
    ) -> None:
        self.path = Path(path)
        if self.path.is_dir() or (not self.path.exists() and self.path.suffix not in (".sqlite", ".db")):
            self.path = self.path / CORPUS_FILE  # a run folder
        if not self.path.exists() and not create:
            raise CorpusError(f"no corpus at {self.path}")
        if create:  # hidden tests: readable by their owner only (never by a sandboxed program)
            owner_dir(self.path.parent)
            owner_file(self.path, sqlite=True)
        try:
            self.db = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives the process being killed (not a power cut); FULL for that too.
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            self.db.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise CorpusError(f"cannot open corpus {self.path}: {exc}") from exc

    def _migrate(self) -> None:
        """Create the tables once; an existing corpus is only read here (readers never take the write lock)."""
        if self._version() is None:
            self.db.executescript(_DDL)  # idempotent (IF NOT EXISTS)
            with self._write():
                if self._version() is None:
                    self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(CORPUS_SCHEMA_VERSION),))
        version = self._version()
        while version in _MIGRATIONS:  # an older corpus: upgrade it in place, one version at a time
            with self._write():
                if self._version() == version:
                    for statement in filter(str.strip, _MIGRATIONS[version].split(";")):
                        self.db.execute(statement)
                    self.db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version + 1),))
            version = self._version()
        if version > CORPUS_SCHEMA_VERSION:
            raise CorpusError(
                f"{self.path} has corpus schema {version}, newer than this code ({CORPUS_SCHEMA_VERSION})"
            )

    def _version(self) -> int | None:
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.OperationalError:  # no meta table yet
            return None
        return int(row[0]) if row else None

    # ---- transactions -------------------------------------------------------------------------------
    class _Tx:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def __enter__(self):
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type, *_):
            self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
            return False

    def _write(self) -> _Tx:
        return Corpus._Tx(self.db)

    # ---- writes ---------------------------------------------------------------------------------------
    def insert(self, task: Task, *, dedup: bool = True) -> InsertResult:
        return self.insert_many([task], dedup=dedup)[0]

    def insert_many(self, tasks: Iterable[Task], *, dedup: bool = True) -> list[InsertResult]:
        """Insert tasks in one transaction, each checked for duplicates against the store (and the earlier
        tasks of this call). A task with a difficulty also gets its first difficulty row."""
        results = []
        with self._write():
            for task in tasks:
                dup = self._duplicate(task) if dedup else None
                if dup is not None:
                    results.append(InsertResult(False, *dup))
                    continue
                if not dedup and self.db.execute("SELECT 1 FROM tasks WHERE id=?", (task.id,)).fetchone():
                    results.append(InsertResult(False, task.id, "same id"))
                    continue
                record = dict(task.to_dict(), difficulty=None)
                fp = task.fingerprints or {}
                self.db.execute(
                    "INSERT INTO tasks (id, family, source, split, level, created_step, generator_checkpoint,"
                    " parent_ids, ast_hash, behaviour_hash, inserted_at, record)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        task.id,
                        task.family,
                        task.source,
                        task.split,
                        task.level,
                        task.created_step,
                        task.generator_checkpoint,
                        json.dumps(task.parent_ids),
                        fp.get("ast"),
                        fp.get("behaviour"),
                        time.time(),
                        json.dumps(record, sort_keys=True, ensure_ascii=False, allow_nan=False),
                    ),
                )
                if task.difficulty is not None:
                    self._record_difficulty(task.id, None, float(task.difficulty), None, task.created_step)
                results.append(InsertResult(True))
        return results

    def reserve(self, tasks: Iterable[Task], reason: str = "held-out") -> int:
        """Keep these tasks' programs out of the corpus: later inserts (and every generator that dedups against
        the corpus) treat a task with the same id, program or behaviour as a duplicate. Returns how many were
        newly reserved. Reserved tasks are not corpus rows: queries, counts and exports never see them."""
        with self._write():
            before = self.reserved_count()
            self.db.executemany(
                "INSERT OR IGNORE INTO reserved VALUES (?,?,?,?)",
                [
                    (t.id, (t.fingerprints or {}).get("ast"), (t.fingerprints or {}).get("behaviour"), reason)
                    for t in tasks
                ],
            )
            return self.reserved_count() - before

    def reserved_count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM reserved").fetchone()[0]

    def _duplicate(self, task: Task, tables=DEDUP_TABLES) -> tuple[str, str] | None:
        fp = task.fingerprints or {}
        for table, prefix in tables:
            if self.db.execute(f"SELECT 1 FROM {table} WHERE id=?", (task.id,)).fetchone():
                return task.id, prefix + "same id"
            for column, value, why in (
                ("ast_hash", fp.get("ast"), "same program"),
                ("behaviour_hash", fp.get("behaviour"), "same behaviour"),
            ):
                if value:
                    row = self.db.execute(f"SELECT id FROM {table} WHERE {column}=? LIMIT 1", (value,)).fetchone()
                    if row:
                        return row[0], prefix + why
        return None

    def find_duplicate(
        self, task_id: str, ast_hash: str | None, behaviour_hash: str | None, reserved_only: bool = False
    ) -> str | None:
        """CorpusIndex protocol (generator.validity): the id of a stored duplicate, or None."""
        probe = Task(
            id=task_id,
            family="",
            source="import",
            split="",
            level=1,
            description="",
            entry_point="",
            signature="",
            reference_solution="",
            fingerprints={"ast": ast_hash, "behaviour": behaviour_hash},
        )
        dup = self._duplicate(probe, DEDUP_TABLES[1:] if reserved_only else DEDUP_TABLES)
        return dup[0] if dup else None

    def reserved_index(self) -> ReservedIndex:
        """A CorpusIndex over the reserved programs alone: for task streams that may repeat a training program but
        never a held-out one (the loop's procedural tasks)."""
        return ReservedIndex(self)

    def update_difficulty(
        self, task_id: str, solve_rate: float, *, n_samples: int | None = None, step: int | None = None
    ) -> None:
        """Record a measured solve rate (difficulty = 1 - solve_rate); the history keeps every measurement."""
        if not isinstance(solve_rate, (int, float)) or not 0.0 <= solve_rate <= 1.0:
            raise CorpusError(f"solve_rate must be in [0, 1], got {solve_rate!r}")
        with self._write():
            if not self.db.execute("SELECT 1 FROM tasks WHERE id=?", (task_id,)).fetchone():
                raise CorpusError(f"no task {task_id!r} in {self.path}")
            self._record_difficulty(task_id, float(solve_rate), 1.0 - float(solve_rate), n_samples, step)

    def _record_difficulty(self, task_id, solve_rate, difficulty, n_samples, step) -> None:
        cur = self.db.execute(
            "INSERT INTO difficulty (task_id, solve_rate, difficulty, n_samples, step, recorded_at)"
            " VALUES (?,?,?,?,?,?)",
            (task_id, solve_rate, difficulty, n_samples, step, time.time()),
        )
        self.db.execute(
            "INSERT INTO difficulty_latest VALUES (?,?,?) ON CONFLICT(task_id) DO UPDATE SET"
            " difficulty=excluded.difficulty, seq=excluded.seq",
            (task_id, difficulty, cur.lastrowid),
        )

    # ---- reads ----------------------------------------------------------------------------------------
    def _where(self, split=None, family=None, level=None, source=None, min_difficulty=None, max_difficulty=None):
        clauses, args = [], []
        for column, value in (("t.split", split), ("t.family", family), ("t.level", level), ("t.source", source)):
            if value is not None:
                clauses.append(f"{column}=?")
                args.append(value)
        if min_difficulty is not None:
            clauses.append("d.difficulty >= ?")
            args.append(float(min_difficulty))
        if max_difficulty is not None:
            clauses.append("d.difficulty <= ?")
            args.append(float(max_difficulty))
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args

    def iter_tasks(
        self, *, limit: int | None = None, order: str = "insertion", seed: int = 0, **filters
    ) -> Iterator[Task]:
        """Tasks matching the filters (split, family, level, source, min_difficulty, max_difficulty), in
        insertion order or in a seeded pseudo-random order (order="random")."""
        where, args = self._where(**filters)
        order_by = {"insertion": "t.seq", "random": f"(t.seq * 2654435761 + {int(seed)}) % 4294967296, t.seq"}
        if order not in order_by:
            raise CorpusError(f"order must be 'insertion' or 'random', got {order!r}")
        sql = (
            "SELECT t.record, d.difficulty FROM tasks t LEFT JOIN difficulty_latest d ON d.task_id = t.id"
            f"{where} ORDER BY {order_by[order]}"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        for record, difficulty in self.db.execute(sql, args):
            yield _task(record, difficulty)

    def query(self, **kwargs) -> list[Task]:
        return list(self.iter_tasks(**kwargs))

    def get(self, task_id: str) -> Task | None:
        row = self.db.execute(
            "SELECT t.record, d.difficulty FROM tasks t LEFT JOIN difficulty_latest d ON d.task_id = t.id WHERE t.id=?",
            (task_id,),
        ).fetchone()
        return _task(*row) if row else None

    def difficulty_history(self, task_id: str) -> list[dict]:
        rows = self.db.execute(
            "SELECT solve_rate, difficulty, n_samples, step FROM difficulty WHERE task_id=? ORDER BY seq", (task_id,)
        )
        return [dict(zip(("solve_rate", "difficulty", "n_samples", "step"), r)) for r in rows]

    def count(self, **filters) -> int:
        where, args = self._where(**filters)
        return self.db.execute(
            f"SELECT COUNT(*) FROM tasks t LEFT JOIN difficulty_latest d ON d.task_id = t.id{where}", args
        ).fetchone()[0]

    def counts(self, by: str, **filters) -> dict:
        if by not in FILTERS:
            raise CorpusError(f"counts by {by!r}: choose one of {', '.join(FILTERS)}")
        where, args = self._where(**filters)
        rows = self.db.execute(
            f"SELECT t.{by}, COUNT(*) FROM tasks t LEFT JOIN difficulty_latest d"
            f" ON d.task_id = t.id{where} GROUP BY t.{by} ORDER BY t.{by}",
            args,
        )
        return dict(rows.fetchall())

    def __len__(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]

    # ---- lifetime -------------------------------------------------------------------------------------
    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Corpus:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _task(record: str, difficulty) -> Task:
    try:
        task = Task.from_json(record)
    except SchemaError as exc:  # cannot happen for rows this module wrote
        raise CorpusError(f"corrupt task row: {exc}") from exc
    task.difficulty = difficulty
    return task


class HeldoutLeak(UserError):
    """Training tasks that belong to a held-out split or repeat a held-out task's id, program or behaviour."""


def check_heldout(run_dir: str | Path, tasks: Iterable[Task], tasks_cfg, when: str) -> int:
    """Stop the run when a training task is held out: `generator.splits.check_disjoint` of `tasks` (corpus rows,
    free-format proposals included: a task without params is judged by its program) against the run's held-out
    tasks (RUN_DIR/heldout.jsonl; nothing to check before it is drawn). Raises HeldoutLeak, one line naming `when`
    and the ids; returns how many tasks were checked. The loop runs it on the whole corpus at the start of every
    run and on the rows each corpus update inserts."""
    from generator.splits import HeldoutIndex, SplitConfig, check_disjoint, split_of_task

    tasks = list(tasks)
    path = RunPaths(run_dir).heldout
    if not path.exists() or not tasks:
        return len(tasks)
    heldout = [Task.from_json(line) for line in path.read_text().splitlines() if line.strip()]
    cfg, index = SplitConfig.from_config(tasks_cfg), HeldoutIndex(heldout)
    leaked = [t for t in tasks if split_of_task(t, index, cfg) != "train" or index.match(t) is not None]
    if leaked:
        ids = [t.id for t in leaked]
        shown = ", ".join(ids[:20]) + (f", ... ({len(ids) - 20} more)" if len(ids) > 20 else "")
        first = check_disjoint(leaked[:1], heldout, cfg)
        raise HeldoutLeak(
            f"{when}: {len(ids)} training task(s) held out ({path.name}): {shown}{'; ' + first[0] if first else ''}"
        )
    return len(tasks)


def corpus_path(run_dir: str | Path) -> Path:
    return RunPaths(run_dir).corpus


class ReservedIndex:
    """`Corpus.reserved_index()`: duplicates among the reserved (held-out, fixed-pool) programs only."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus

    def find_duplicate(self, task_id: str, ast_hash: str | None, behaviour_hash: str | None) -> str | None:
        return self.corpus.find_duplicate(task_id, ast_hash, behaviour_hash, reserved_only=True)
