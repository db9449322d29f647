"""TraceLog: one whole JSON line per execution, also with several processes appending; summaries."""

import hashlib
import json
import multiprocessing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.trace import TraceError, TraceLog, error_type, read_trace, summarize

TB = 'Traceback (most recent call last):\n  File "<prog>", line 1, in <module>\nZeroDivisionError: division by zero\n'


def test_record_fields_and_caps(tmp_path):
    path = tmp_path / "sub" / "trace.jsonl"
    with TraceLog(str(path), max_output=10) as log:
        log.record(
            "run",
            "print(1/0)",
            {"status": "error", "stdout": "x" * 50, "stderr": TB, "duration_s": 0.01, "cached": False},
        )
    (rec,) = read_trace(str(path))
    assert rec["kind"] == "run" and rec["status"] == "error" and rec["duration_s"] == 0.01
    assert rec["code_sha256"] == hashlib.sha256(b"print(1/0)").hexdigest()
    assert rec["stdout"] == "...[capped]" + "x" * 10 and rec["stderr"].endswith("by zero\n")
    assert rec["error_type"] == "ZeroDivisionError" and rec["cached"] is False and "tests" not in rec


def test_test_report_counts(tmp_path):
    path = str(tmp_path / "t.jsonl")
    report = {
        "status": "ok",
        "duration_s": 0.02,
        "cached": True,
        "stdout": "",
        "stderr": "",
        "tests": [
            {"status": "ok", "passed": True},
            {"status": "ok", "passed": False},
            {"status": "error", "passed": False, "error": "KeyError: 3"},
            {"status": "timeout", "passed": False, "error": None},
        ],
    }
    TraceLog(path).record("tests", "def f(x): ...", report)
    (rec,) = read_trace(path)
    assert rec["cached"] is True
    assert rec["tests"] == {
        "passed": 1,
        "total": 4,
        "by_status": {"ok": 2, "error": 1, "timeout": 1},
        "error_types": {"KeyError": 1},
    }


def test_summarize(tmp_path):
    path = str(tmp_path / "t.jsonl")
    log = TraceLog(path)
    log.record("run", "a", {"status": "ok", "duration_s": 0.1})
    log.record("run", "b", {"status": "error", "stderr": TB, "duration_s": 0.3})
    log.record("run", "b", {"status": "error", "stderr": TB, "duration_s": 0.3, "cached": True})
    log.record(
        "tests",
        "c",
        {
            "status": "timeout",
            "duration_s": 5.0,
            "tests": [{"status": "error", "error": "IndexError: list index out of range"}],
        },
    )
    with open(path, "a") as f:
        f.write('{"torn": \n')
    s = summarize(path)
    assert s["records"] == 4 and s["malformed_lines"] == 1 and s["cached"] == 1
    assert s["by_status"] == {"ok": 1, "error": 2, "timeout": 1}
    assert s["by_kind"] == {"run": 3, "tests": 1}
    assert s["median_duration_s"] == pytest.approx(0.3)  # fresh runs only: 0.1, 0.3, 5.0
    assert s["top_error_types"] == [("ZeroDivisionError", 2), ("IndexError", 1)]
    assert s["distinct_programs"] == 3


def test_bad_paths_fail_clearly(tmp_path):
    with pytest.raises(TraceError, match="empty"):
        TraceLog("")
    with pytest.raises(TraceError, match="cannot open"):
        TraceLog(str(tmp_path))  # a folder
    with pytest.raises(TraceError, match="not found"):
        read_trace(str(tmp_path / "none.jsonl"))


def _append(path, worker, n):
    log = TraceLog(path)
    big = "y" * 3000  # long lines make interleaving likely if writes were not whole
    for i in range(n):
        log.record("run", f"{worker}:{i}", {"status": "ok", "stdout": big, "stderr": big, "duration_s": i})


def test_concurrent_appends_keep_lines_whole(tmp_path):
    path = str(tmp_path / "shared.jsonl")
    with multiprocessing.get_context("fork").Pool(4) as pool:  # raises here if a writer failed
        pool.starmap(_append, [(path, w, 200) for w in range(4)])
    with open(path) as f:
        lines = f.read().splitlines()
    assert len(lines) == 800
    seen = {json.loads(line)["code_sha256"] for line in lines}  # every line parses
    assert seen == {hashlib.sha256(f"{w}:{i}".encode()).hexdigest() for w in range(4) for i in range(200)}


@pytest.mark.parametrize(
    "text,expected",
    [
        (TB, "ZeroDivisionError"),
        ("KeyError: 'x'", "KeyError"),
        ("mymod.BadThing: nope", "BadThing"),
        ("Traceback...\nKeyboardInterrupt\n\n", "KeyboardInterrupt"),
        ("", None),
        (None, None),
        ("some words here", None),
    ],
)
def test_error_type(text, expected):
    assert error_type(text) == expected


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300), st.sampled_from(["ok", "error", "timeout"]))
def test_any_output_round_trips_as_one_line(tmp_path_factory, out, err, status):
    path = str(tmp_path_factory.mktemp("t") / "t.jsonl")
    TraceLog(path, max_output=100).record("run", out, {"status": status, "stdout": out, "stderr": err})
    (rec,) = read_trace(path)
    assert rec["status"] == status and rec["stdout"] == (out if len(out) <= 100 else "...[capped]" + out[-100:])


def test_sandbox_trace_path_logs_every_execution(tmp_path):
    import sandbox

    path = str(tmp_path / "trace.jsonl")
    with sandbox.open_sandbox("process", workers=1, trace_path=path) as sb:
        sb.run("print(1)")
        sb.run("print(1)")
        sb.run("1/0")
        sb.run_tests("def f(x):\n    return [][x]", "f", [[0], [1]])
    s = summarize(path)
    assert s["records"] == 4 and s["cached"] == 1 and s["by_kind"] == {"run": 3, "tests": 1}
    assert dict(s["top_error_types"]) == {"ZeroDivisionError": 1, "IndexError": 2}
