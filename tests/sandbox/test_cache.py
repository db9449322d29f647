"""ResultCache: keys ignore layout but not meaning; only deterministic outcomes are stored; SQLite sharing."""

import json
import multiprocessing
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.cache import CACHEABLE_STATUSES, CacheError, ResultCache, cache_key, canonical_json, is_cacheable

PROG = "def f(x):\n    return x + 1\nprint(f(1))\n"
SAME_AST = "# a comment\ndef f( x ) :\n\n    return (x+1)   # trailing\n\n\nprint( f(1) )"
OTHER = "def f(x):\n    return x + 2\nprint(f(1))\n"
RESULT = {"status": "ok", "stdout": "2\n", "stderr": "", "duration_s": 0.003, "cached": False, "meta": {}}


def test_key_ignores_formatting_and_comments_but_not_code():
    assert cache_key("run", PROG) == cache_key("run", SAME_AST)
    assert cache_key("run", PROG) != cache_key("run", OTHER)


def test_key_separates_kind_payload_and_limits():
    base = cache_key("tests", PROG, {"entry_point": "f", "inputs": [[1]]}, {"timeout_s": 5})
    assert base != cache_key("run", PROG, {"entry_point": "f", "inputs": [[1]]}, {"timeout_s": 5})
    assert base != cache_key("tests", PROG, {"entry_point": "f", "inputs": [[2]]}, {"timeout_s": 5})
    assert base != cache_key("tests", PROG, {"entry_point": "f", "inputs": [[1]]}, {"timeout_s": 6})
    # dict order does not matter; tuples are lists (JSON)
    assert base == cache_key("tests", PROG, {"inputs": [(1,)], "entry_point": "f"}, {"timeout_s": 5})


def test_unparseable_source_is_keyed_by_its_raw_text():
    assert cache_key("run", "def (:") != cache_key("run", "def  (:")
    assert cache_key("run", "def (:") == cache_key("run", "def (:")


def test_bad_key_parts_raise_clear_errors():
    with pytest.raises(CacheError, match="JSON"):
        cache_key("run", PROG, {"x": object()})
    with pytest.raises(CacheError, match="str"):
        cache_key("run", b"print(1)")
    with pytest.raises(CacheError, match="kind"):
        cache_key("", PROG)
    with pytest.raises(CacheError, match="max_items"):
        ResultCache(max_items=0)


def test_get_put_marks_cached_and_returns_copies():
    cache = ResultCache()
    key = cache.key("run", PROG)
    assert cache.get(key) is None
    assert cache.put(key, RESULT)
    got = cache.get(key)
    assert got == {**RESULT, "cached": True}
    got["stdout"] = "tampered"
    assert cache.get(key)["stdout"] == "2\n"
    assert cache.stats() == {
        "hits": 2,
        "misses": 1,
        "hit_rate": 2 / 3,
        "puts": 1,
        "skipped": 0,
        "disk_errors": 0,
        "items": 1,
    }


@pytest.mark.parametrize("status", ["killed", "sandbox_error", "weird", None])
def test_nondeterministic_outcomes_are_not_stored(status):
    cache = ResultCache()
    assert not cache.put("k", {**RESULT, "status": status})
    assert cache.get("k") is None and cache.stats()["skipped"] == 1


def test_report_with_a_killed_test_is_not_stored():
    report = {"status": "ok", "tests": [{"status": "ok", "passed": True}, {"status": "killed", "passed": False}]}
    assert not is_cacheable(report)
    assert is_cacheable({**report, "tests": [{"status": "timeout"}, {"status": "not_run"}]})


@pytest.mark.parametrize("status", sorted(CACHEABLE_STATUSES))
def test_deterministic_outcomes_are_stored(status):
    cache = ResultCache()
    assert cache.put("k", {**RESULT, "status": status})
    assert cache.get("k")["status"] == status


def test_lru_evicts_least_recently_used():
    cache = ResultCache(max_items=2)
    cache.put("a", RESULT)
    cache.put("b", RESULT)
    cache.get("a")  # a is now the most recent
    cache.put("c", RESULT)
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert len(cache) == 2


def test_sqlite_backing_survives_a_new_cache_and_uses_wal(tmp_path):
    path = str(tmp_path / "cache.sqlite")
    first = ResultCache(path)
    first.put("k", RESULT)
    first.close()
    second = ResultCache(path)
    assert second.get("k") == {**RESULT, "cached": True}
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_disk_prune_keeps_the_newest(tmp_path, monkeypatch):
    monkeypatch.setattr("sandbox.cache._PRUNE_EVERY", 5)
    path = str(tmp_path / "cache.sqlite")
    cache = ResultCache(path, max_items=1, max_disk_items=3)
    for i in range(10):
        cache.put(f"k{i}", RESULT)
    rows = sqlite3.connect(path).execute("SELECT key FROM results ORDER BY rowid").fetchall()
    assert [r[0] for r in rows] == ["k7", "k8", "k9"]


def test_bad_cache_path_fails_at_construction(tmp_path):
    with pytest.raises(CacheError, match="cannot open the result cache"):
        ResultCache(str(tmp_path / "missing-dir" / "cache.sqlite"))


def _writer(path, worker, n):
    cache = ResultCache(path)
    for i in range(n):
        cache.put(f"{worker}-{i}", {**RESULT, "stdout": f"{worker}-{i}"})
        cache.get(f"{(worker + 1) % 3}-{i}")


def test_several_processes_share_one_file(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    ResultCache(path).close()
    with multiprocessing.get_context("fork").Pool(3) as pool:  # raises here if a writer failed
        pool.starmap(_writer, [(path, w, 40) for w in range(3)])
    cache = ResultCache(path)
    for w in range(3):
        for i in range(40):
            assert cache.get(f"{w}-{i}")["stdout"] == f"{w}-{i}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(json_values, json_values)
def test_canonical_json_never_merges_different_values(a, b):
    if canonical_json(a) == canonical_json(b):
        assert a == b
    assert json.loads(canonical_json(a)) == a


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(max_size=4), json_values, max_size=5))
def test_canonical_json_ignores_key_order(d):
    assert canonical_json(d) == canonical_json(dict(reversed(list(d.items()))))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["x = 1", "y = x + 2", "print(y)", "def g():\n    return 3", "# note", ""]), max_size=6),
    st.integers(0, 3),
)
def test_key_is_layout_invariant(lines, blank_lines):
    # the same statements with extra blank lines and comments give the same key
    plain = "\n".join(lines)
    spaced = ("\n" * blank_lines + "# header\n").join(lines)
    assert cache_key("run", plain) == cache_key("run", spaced)


# ----------------------------------------------------------------------------- through the public sandbox API
def test_sandbox_results_say_whether_they_were_cached_and_the_file_is_shared(tmp_path):
    import sandbox

    path = str(tmp_path / "shared.sqlite")
    with sandbox.open_sandbox("process", workers=1, cache_path=path) as sb:
        first, again = sb.run(PROG), sb.run(SAME_AST)
        killed = sb.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        killed_again = sb.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert (first.cached, again.cached, again.stdout) == (False, True, "2\n")
    assert killed.status == "killed" and not killed_again.cached
    with sandbox.open_sandbox("process", workers=1, cache_path=path) as sb:  # a new process pool, same file
        later = sb.run(PROG)
        report = sb.run_tests(PROG, "f", [[1], [2]], [2, 0])
        report_again = sb.run_tests(PROG, "f", [[1], [2]], [2, 3])  # expected values are not part of the key
    assert later.cached and later.stdout == "2\n"
    assert not report.cached and report_again.cached and [t.passed for t in report_again.tests] == [True, True]


def test_measure_hit_cost_reports_a_hit(capsys):
    import sandbox
    from sandbox.cache import measure_hit_cost

    with sandbox.open_sandbox("process", workers=1) as sb:
        out = measure_hit_cost(sb, PROG, n=3)
    assert out["lookup_hit"] and out["api_hit_cached"] and out["status"] == "ok"
    assert "cache hit cost" in capsys.readouterr().out
