"""The result cache is bounded in bytes, in memory and on disk, and a single oversized result is never stored:
a wrong program's large outputs cost a re-run, not the trainer's memory or the run folder's disk."""

from __future__ import annotations

from sandbox_testlib import open_backend

from sandbox.cache import MAX_ENTRY_BYTES, ResultCache


def result(i: int, size: int) -> dict:
    return {"status": "error", "stdout": f"{i}:" + "x" * size, "stderr": "", "duration_s": 0.0, "meta": {}}


def test_memory_is_bounded_in_bytes():
    cache = ResultCache(max_bytes=200_000)
    for i in range(100):
        assert cache.put(cache.key("run", f"print({i})"), result(i, 10_000))
        assert cache.memory_bytes <= 200_000
    assert 10 <= len(cache) <= 20
    assert cache.get(cache.key("run", "print(99)"))["stdout"].startswith("99:")  # the newest stay
    assert cache.get(cache.key("run", "print(0)")) is None


def test_disk_is_bounded_in_bytes(tmp_path):
    path = str(tmp_path / "cache.sqlite")
    bound = 320_000
    cache = ResultCache(path, max_items=1, max_disk_bytes=bound)
    for i in range(300):
        cache.put(cache.key("run", f"print({i})"), result(i, 10_000))
        assert cache.disk_bytes() <= bound * 17 // 16 + 11_000
    assert cache.disk_bytes() <= bound * 17 // 16 + 11_000
    fresh = ResultCache(path, max_items=1, max_disk_bytes=bound)
    assert fresh.get(cache.key("run", "print(299)")) is not None
    assert fresh.get(cache.key("run", "print(0)")) is None
    cache.close()
    fresh.close()


def test_an_oversized_result_is_not_stored(tmp_path):
    cache = ResultCache(str(tmp_path / "cache.sqlite"), max_entry_bytes=50_000)
    assert not cache.put(cache.key("run", "big"), result(0, 60_000))
    assert cache.get(cache.key("run", "big")) is None and cache.stats()["skipped"] == 1
    assert cache.disk_bytes() == 0 and cache.memory_bytes == 0
    assert cache.put(cache.key("run", "small"), result(1, 1_000))


WRONG_LARGE = "def f(i):\n    return 'y' * 900_000\n"


def test_a_wrong_run_with_large_outputs_is_not_cached():
    box = open_backend("process", workers=1, cache=True)
    try:
        inputs = [[i] for i in range(8)]
        first = box.run_tests(WRONG_LARGE, "f", inputs, ["no"] * 8)
        assert not first.passed and all(t.status == "ok" for t in first.tests), first.tests[0].status
        again = box.run_tests(WRONG_LARGE, "f", inputs, ["no"] * 8)
        assert not again.cached  # over MAX_ENTRY_BYTES: run again, never held
        assert box._cache.memory_bytes <= MAX_ENTRY_BYTES
    finally:
        box.close()
