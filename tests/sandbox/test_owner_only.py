"""What holds hidden tests and expected outputs (run folders, the corpus, the result cache, traces) is created
readable by its owner only, whatever the umask, so a sandboxed program running under a uid of its own cannot read
it even where it can see it."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

import pytest
from sandbox_testlib import open_backend

from sandbox.cache import ResultCache
from sandbox.trace import TraceLog
from selfplay.data.corpus import Corpus


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def side_files(path: str) -> list[str]:
    return [path + s for s in ("-wal", "-shm") if os.path.exists(path + s)]


def test_cache_and_trace_files_are_owner_only(tmp_path, umask_022):
    cache_path = str(tmp_path / "cache.sqlite")
    cache = ResultCache(cache_path)
    assert cache.put(cache.key("run", "print(1)", {}, {"timeout_s": 1}), {"status": "ok", "stdout": "1\n"})
    assert mode(cache_path) == 0o600
    assert side_files(cache_path) and all(mode(p) == 0o600 for p in side_files(cache_path))
    trace_path = tmp_path / "new" / "folder" / "trace.jsonl"
    trace = TraceLog(str(trace_path))
    trace.record("run", "print(1)", {"status": "ok", "stdout": "1\n", "stderr": "", "duration_s": 0.0, "meta": {}})
    assert mode(trace_path) == 0o600 and mode(trace_path.parent) == 0o700


def test_an_existing_world_readable_cache_is_tightened(tmp_path, umask_022):
    path = tmp_path / "old.sqlite"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    ResultCache(str(path))
    assert mode(path) == 0o600


def test_a_run_folder_and_its_corpus_are_owner_only(tmp_path, umask_022):
    run = tmp_path / "runs" / "tiny"
    corpus = Corpus(run)
    assert mode(run) == 0o700
    assert mode(corpus.path) == 0o600
    assert all(mode(p) == 0o600 for p in side_files(str(corpus.path)))


@pytest.mark.skipif(os.geteuid() != 0, reason="children have a uid of their own only when the server runs as root")
def test_a_sandboxed_program_cannot_read_a_corpus_it_can_see(umask_022):
    # a folder every user may enter, outside the private or hidden dirs of the process backend, and a server without
    # the programs' own root (confine=False: they see the host's tree), so that the mode alone decides
    shared = tempfile.mkdtemp(prefix="sandbox-owner-test-", dir="/var/lib")
    os.chmod(shared, 0o755)
    try:
        corpus = Corpus(os.path.join(shared, "corpus.sqlite"))
        corpus.db.execute("CREATE TABLE IF NOT EXISTS secret (answer TEXT)")
        corpus.db.execute("INSERT INTO secret VALUES ('42')")
        box = open_backend("process", workers=1, confine=False)
        try:
            probe = (
                f"import os\nprint(os.path.exists({str(corpus.path)!r}))\n"
                f"try:\n    open({str(corpus.path)!r}, 'rb').read()\n    print('read')\n"
                f"except PermissionError:\n    print('denied')\n"
            )
            result = box.run(probe)
            assert (result.status, result.stdout) == ("ok", "True\ndenied\n"), result
        finally:
            box.close()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
