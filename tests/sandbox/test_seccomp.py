"""sandbox/seccomp.py on this kernel: a forked process installs the filter and makes the calls it denies and some it
allows; each denied call fails with EPERM, each allowed one works."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import socket
import struct

import pytest

from sandbox import seccomp

MACHINE = os.uname().machine
pytestmark = pytest.mark.skipif(MACHINE not in seccomp.SYSCALLS, reason=f"no filter for {MACHINE}")

PROBES = r"""
libc = ctypes.CDLL(None, use_errno=True)
nr = seccomp.SYSCALLS[MACHINE]

def sys_errno(*args):
    return 0 if libc.syscall(*args) >= 0 else ctypes.get_errno()

def py_errno(fn):
    try:
        fn()
        return 0
    except OSError as exc:
        return exc.errno

fd = os.open(os.__file__, os.O_RDONLY)
record = struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)
out = {
    "add_key": sys_errno(nr["add_key"], b"user", b"k", b"v", 1, -4),
    "keyctl": sys_errno(nr["keyctl"], 0, -4, 0, 0, 0),
    "request_key": sys_errno(nr["request_key"], b"user", b"k", None, -4),
    "mq_open": sys_errno(nr["mq_open"], b"q", os.O_CREAT | os.O_RDWR, 0o600, None),
    "mq_unlink": sys_errno(nr["mq_unlink"], b"q"),
    "flock": py_errno(lambda: fcntl.flock(fd, fcntl.LOCK_SH)),
    "setlk": py_errno(lambda: fcntl.fcntl(fd, fcntl.F_SETLK, record)),
    "setlkw": py_errno(lambda: fcntl.fcntl(fd, fcntl.F_SETLKW, record)),
    "getlk": py_errno(lambda: fcntl.fcntl(fd, fcntl.F_GETLK, record)),
    "ofd_setlk": py_errno(lambda: fcntl.fcntl(fd, 37, record)),
    "setlease": py_errno(lambda: fcntl.fcntl(fd, 1024, fcntl.F_RDLCK)),
    "inet": py_errno(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()),
    "inet6": py_errno(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()),
    "vsock": py_errno(lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()),
    "netlink": py_errno(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close()),
    "socketpair_inet": py_errno(lambda: socket.socketpair(socket.AF_INET)),
    "io_uring_setup": sys_errno(nr["io_uring_setup"], 1, ctypes.create_string_buffer(120)),
    "bpf": sys_errno(nr["bpf"], 0, None, 0),
    # allowed
    "unix": py_errno(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()),
    "socketpair_unix": py_errno(lambda: socket.socketpair()),
    "getfl": py_errno(lambda: fcntl.fcntl(fd, fcntl.F_GETFL)),
    "setfd": py_errno(lambda: fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)),
    "pipe": py_errno(os.pipe),
    "fork": py_errno(lambda: os.waitpid(os.fork() or os._exit(0), 0)),
}
if MACHINE == "x86_64":  # the x32 ABI's getpid: another ABI, whose numbers the filter does not check
    out["x32_getpid"] = sys_errno(0x40000000 | 39)
"""
DENIED = [
    "add_key",
    "keyctl",
    "request_key",
    "mq_open",
    "mq_unlink",
    "flock",
    "setlk",
    "setlkw",
    "getlk",
    "ofd_setlk",
    "setlease",
    "inet",
    "inet6",
    "vsock",
    "netlink",
    "socketpair_inet",
    "io_uring_setup",
    "bpf",
]
ALLOWED = ["unix", "socketpair_unix", "getfl", "setfd", "pipe", "fork"]


def probe(install: bool) -> dict:
    """Run PROBES in a forked child (with the filter installed or not) and return its findings."""
    filt = seccomp.build() if install else None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            if filt is not None:
                filt.install()
            scope = {
                "ctypes": ctypes,
                "fcntl": fcntl,
                "os": os,
                "socket": socket,
                "struct": struct,
                "seccomp": seccomp,
                "MACHINE": MACHINE,
            }
            exec(PROBES, scope)
            os.write(w, json.dumps(scope["out"]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return json.loads(data)


def test_denied_calls_fail_with_eperm_and_the_rest_work():
    out = probe(install=True)
    assert {k: out[k] for k in DENIED} == dict.fromkeys(DENIED, errno.EPERM), out
    assert {k: out[k] for k in ALLOWED} == dict.fromkeys(ALLOWED, 0), out
    if MACHINE == "x86_64":
        assert out["x32_getpid"] == errno.EPERM, out


def test_without_the_filter_the_same_calls_are_not_refused_by_it():
    """The probe is meaningful: unfiltered, the kernel answers these calls itself (as root here most succeed)."""
    out = probe(install=False)
    assert out["inet"] == 0 and out["unix"] == 0 and out["getfl"] == 0, out
    assert out["flock"] != errno.EPERM and out["setlk"] != errno.EPERM, out


def test_the_kernel_applies_it():
    filt = seccomp.build()
    assert filt is not None and seccomp.works(filt)


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
def test_a_program_for_each_architecture(machine):
    code = seccomp.program(machine)
    assert len(code) % 8 == 0 and 0 < len(code) // 8 < 256
    first = struct.unpack("=HBBI", code[:8])
    assert first == (seccomp.BPF_LD_W_ABS, 0, 0, seccomp.OFF_ARCH)  # the architecture is checked first
    arch_check = struct.unpack("=HBBI", code[8:16])
    assert arch_check[0] == seccomp.BPF_JEQ_K and arch_check[3] == seccomp.AUDIT_ARCH[machine]


def test_jumps_beyond_the_reach_of_classic_bpf_are_refused():
    code = [("ld", 0)] + [("jeq", i, "far", None) for i in range(300)] + [("label", "far"), ("ret", 0)]
    with pytest.raises(ValueError, match="jump out of range"):
        seccomp._assemble(code)


def test_the_filter_holds_for_a_checkout_under_tmp(tmp_path):
    # The server replaces /tmp with a private one: seccomp.py must be read before that, or a checkout under /tmp
    # (CI's, a user's scratch clone) would run every program without the filter and say so only in meta.
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    shutil.copytree(Path(seccomp.__file__).parent, tmp_path / "sandbox")
    code = (
        "import sandbox\n"
        "with sandbox.open_sandbox(backend='process', workers=1) as sb:\n"
        "    r = sb.run('import socket\\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)')\n"
        "    print(sandbox.__file__, r.meta.get('seccomp'), r.status, 'Operation not permitted' in r.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert out.returncode == 0, out.stderr
    where, applied, status, refused = out.stdout.split()
    assert where.startswith(str(tmp_path)) and (applied, status, refused) == ("True", "error", "True"), out.stdout
