"""What a program finds when it starts is what a fresh process would give it, on every backend, and nothing a
program changes reaches the next one. The fork server prepares part of this state once, before forking, rather
than in every child (sandbox/forkserver.py: ready_for_children, Server._fork_child), so these pin it down: no
new privileges, stdin from /dev/null at EOF, HOME = TMPDIR = tempfile.gettempdir() = the (empty) work dir,
sys.argv, the recursion limit, the standard streams."""

from __future__ import annotations

import json
import textwrap

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandbox_testlib import assert_healthy

STATE = r"""
import json, os, sys, tempfile
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
state = {
    "no_new_privs": status["NoNewPrivs"].strip(),
    "stdin": os.readlink("/proc/self/fd/0"), "stdin_eof": sys.stdin.read() == "",
    "cwd_is_home_tmpdir_tempdir":
        os.getcwd() == os.environ["HOME"] == os.environ["TMPDIR"] == tempfile.gettempdir(),
    "cwd_empty": os.listdir(".") == [],
    "argv": sys.argv, "recursion_limit": sys.getrecursionlimit(),
    "streams": [s is d for s, d in ((sys.stdin, sys.__stdin__), (sys.stdout, sys.__stdout__),
                                    (sys.stderr, sys.__stderr__))],
    "env_keys": sorted(os.environ),
}
"""
FRESH = {
    "no_new_privs": "1",
    "stdin": "/dev/null",
    "stdin_eof": True,
    "cwd_is_home_tmpdir_tempdir": True,
    "cwd_empty": True,
    "argv": ["<program>"],
    "recursion_limit": 1000,
    "streams": [True, True, True],
}

# Ways a program can change the state it was given; each must stay inside that program's child.
MUTATIONS = {
    "environ": "os.environ['HOME'] = os.environ['TMPDIR'] = '/'; os.environ['EXTRA'] = 'x'",
    "tempdir": "tempfile.tempdir = '/'",
    "argv": "sys.argv[:] = ['changed', 'more']",
    "recursion": "sys.setrecursionlimit(50000)",
    "streams": "import io; sys.stdout = io.StringIO(); sys.stdin = io.StringIO('data'); sys.__stdout__ = None",
    "chdir": "os.chdir('/')",
    # files left behind: the work dir cannot be reused, the next child gets a new one (and new HOME, TMPDIR)
    "litter": "open(os.path.join(wd, 'left-behind.txt'), 'w').write('x')",
    "litter_dir": "os.makedirs(os.path.join(wd, 'd/e'), exist_ok=True); open(os.path.join(wd, 'd/e/f'), 'w').close()",
}


def state_of(result) -> dict:
    assert result.status == "ok", result
    return json.loads(result.stdout.splitlines()[-1])


def check_fresh(state: dict) -> None:
    got = {k: state[k] for k in FRESH}
    assert got == FRESH
    assert set(state["env_keys"]) <= {"PATH", "LANG", "PYTHONHASHSEED", "HOME", "TMPDIR", "LC_CTYPE"}, state


def test_a_program_starts_in_a_fresh_state(sb):
    check_fresh(state_of(sb.run(STATE + "print(json.dumps(state))\n")))


def test_a_graded_solution_starts_in_a_fresh_state(sb):
    solution = "def f():\n" + textwrap.indent(STATE, "    ") + "    return state\n"
    report = sb.run_tests(solution, "f", [[]])
    assert report.status == "ok" and report.tests[0].status == "ok", report
    state = report.tests[0].output
    check_fresh(state)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.sampled_from(sorted(MUTATIONS)), max_size=4), min_size=1, max_size=6))
def test_what_a_program_changes_never_reaches_the_next(sb, batches):
    """Any run of programs, each changing some of its state (and some leaving files, so that the next program
    gets a new work dir and so new HOME and TMPDIR), run over the workers: every probe after them is fresh."""
    programs = []
    for changes in batches:
        mutations = "\n".join(MUTATIONS[c] for c in changes)
        programs.append(f"import os, sys, tempfile\nwd = os.getcwd()\n{mutations}\n")
        programs.append(STATE + "print(json.dumps(state))\n")
    results = sb.run_many(programs)
    for mutate, probe in zip(results[0::2], results[1::2]):
        assert mutate.status == "ok", mutate
        check_fresh(state_of(probe))
    assert_healthy(sb)
