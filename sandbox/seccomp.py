"""A seccomp filter for the sandbox's programs: the system calls that create kernel state a program could leave for
the next one, or reach outside its namespaces, fail with EPERM. Stdlib only (struct and ctypes: a classic BPF
program, no libseccomp), and free of imports from the `sandbox` package: the fork server loads this file by path
from beside itself (`forkserver.load_seccomp`), on the host and in a container (the Docker backend mounts both).

What it denies (every other call is left to the kernel and the other isolation layers):

- keyrings: `add_key`, `request_key`, `keyctl`. Keys belong to a uid (the user keyring), not to a namespace the
  worker owns: a key added by one program would be read by the next one under the same uid, and outlive the pool;
- POSIX message queues: `mq_open` and the other `mq_*` calls (a queue lives in the worker's IPC namespace until
  someone unlinks it, so it would reach the next program);
- file locks: `flock`, and `fcntl` with a lock or lease command (F_GETLK, F_SETLK, F_SETLKW, their OFD forms,
  F_SETLEASE). A lock is on the inode: one on a read-only bound host file (the Python installation) is seen by
  other workers' programs and by host processes, a covert channel and a way to block a host process;
- sockets of any family but AF_UNIX (`socket`, `socketpair`): AF_VSOCK is outside the network namespace (it
  reaches the hypervisor), AF_NETLINK, AF_PACKET, AF_INET/AF_INET6 (only a loopback that is down in the
  namespace) and the rest are of no use to a program; AF_UNIX stays for `socket.socketpair()`, asyncio and
  multiprocessing;
- `io_uring_setup`, `io_uring_enter`, `io_uring_register`: io_uring performs operations (a socket of any family,
  among them) without the system calls this filter sees;
- `bpf`: maps and programs are kernel objects of no use to a program;
- every system call of another ABI (i386 through `int 0x80` on x86-64, x32, arm32 on arm64), whose numbers this
  filter does not check.

Supported: x86-64 and arm64 (`AUDIT_ARCH_X86_64`, `AUDIT_ARCH_AARCH64`); elsewhere `build()` returns None and the
server reports seccomp absent (`Sandbox.missing_isolation()` names it).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

# classic BPF
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = 32-bit word at offset k of seccomp_data
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_MODE_FILTER = 2
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_GET_SECCOMP = 21

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian on both
# architectures: the low 32 bits of args[i] are at 16 + 8 i, and the kernel reads socket's family and fcntl's
# command as 32-bit ints)
OFF_NR, OFF_ARCH = 0, 4


def _arg_low(i: int) -> int:
    return 16 + 8 * i


AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# system call numbers per architecture (x86-64: arch/x86/entry/syscalls/syscall_64.tbl; arm64: the generic table)
SYSCALLS = {
    "x86_64": {
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "mq_open": 240,
        "mq_unlink": 241,
        "mq_timedsend": 242,
        "mq_timedreceive": 243,
        "mq_notify": 244,
        "mq_getsetattr": 245,
        "flock": 73,
        "fcntl": 72,
        "socket": 41,
        "socketpair": 53,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 321,
    },
    "aarch64": {
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "mq_open": 180,
        "mq_unlink": 181,
        "mq_timedsend": 182,
        "mq_timedreceive": 183,
        "mq_notify": 184,
        "mq_getsetattr": 185,
        "flock": 32,
        "fcntl": 25,
        "socket": 198,
        "socketpair": 199,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "bpf": 280,
    },
}
DENIED = (
    "add_key",
    "request_key",
    "keyctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    "flock",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
)
AF_UNIX = 1
SOCKET_FAMILIES = (AF_UNIX,)  # what socket()/socketpair() may create
# fcntl commands that take, test or lease a lock: F_GETLK, F_SETLK, F_SETLKW (5-7), their 32-bit-ABI *64 forms
# (12-14), F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW (36-38), F_SETLEASE (1024)
LOCK_COMMANDS = (5, 6, 7, 12, 13, 14, 36, 37, 38, 1024)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _assemble(code: list) -> bytes:
    """Instructions as ("ld", offset) | ("jeq"/"jge", k, true_label, false_label) | ("ret", k) | ("label", name);
    labels only forward (classic BPF jumps forward, at most 255 instructions)."""
    where, n = {}, 0
    for ins in code:
        if ins[0] == "label":
            where[ins[1]] = n
        else:
            n += 1
    out, pc = [], 0
    for ins in code:
        op = ins[0]
        if op == "label":
            continue
        if op == "ld":
            out.append(struct.pack("=HBBI", BPF_LD_W_ABS, 0, 0, ins[1]))
        elif op == "ret":
            out.append(struct.pack("=HBBI", BPF_RET_K, 0, 0, ins[1]))
        else:
            jt, jf = (0 if t is None else where[t] - pc - 1 for t in ins[2:4])
            if not (0 <= jt < 256 and 0 <= jf < 256):
                raise ValueError(f"jump out of range at {pc}: {ins}")
            out.append(struct.pack("=HBBI", BPF_JEQ_K if op == "jeq" else BPF_JGE_K, jt, jf, ins[1]))
        pc += 1
    return b"".join(out)


def program(machine: str, errno_value: int = errno.EPERM) -> bytes:
    """The filter's BPF instructions for `machine` (os.uname().machine): see the module docstring."""
    nrs = SYSCALLS[machine]
    deny = SECCOMP_RET_ERRNO | errno_value
    code = [("ld", OFF_ARCH), ("jeq", AUDIT_ARCH[machine], None, "deny"), ("ld", OFF_NR)]
    if machine == "x86_64":
        code.append(("jge", X32_SYSCALL_BIT, "deny", None))
    for name in DENIED:
        code.append(("jeq", nrs[name], "deny", None))
    code += [
        ("jeq", nrs["socket"], "family", None),
        ("jeq", nrs["socketpair"], "family", None),
        ("jeq", nrs["fcntl"], "fcntl", None),
        ("ret", SECCOMP_RET_ALLOW),
        ("label", "family"),
        ("ld", _arg_low(0)),
    ]
    code += [("jeq", family, "allow", None) for family in SOCKET_FAMILIES]
    code += [("ret", deny), ("label", "fcntl"), ("ld", _arg_low(1))]
    code += [("jeq", cmd, "deny", None) for cmd in LOCK_COMMANDS]
    code += [("label", "allow"), ("ret", SECCOMP_RET_ALLOW), ("label", "deny"), ("ret", deny)]
    return _assemble(code)


class Filter:
    """A filter ready to install: built once (in the server), installed by each forked child with one prctl."""

    def __init__(self, code: bytes):
        self.code = ctypes.create_string_buffer(code, len(code))
        self.prog = _SockFprog(len(code) // 8, ctypes.cast(self.code, ctypes.c_void_p))
        self._prctl = ctypes.CDLL(None, use_errno=True).prctl
        self._prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
        self._prog_ref = ctypes.cast(ctypes.pointer(self.prog), ctypes.c_void_p)

    def install(self) -> None:
        """Set no_new_privs (needed without CAP_SYS_ADMIN; a no-op where it is set) and install the filter on this
        thread (the children are single-threaded when they install it: their program starts afterwards, and every
        process and thread it makes inherits the filter). Raises OSError when the kernel refuses."""
        if (
            self._prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0
            or self._prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._prog_ref, 0, 0) != 0
        ):
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp filter refused: {os.strerror(err)}")


def build() -> Filter | None:
    """The filter for this machine's architecture, or None where it is not supported (another architecture)."""
    machine = os.uname().machine
    if machine not in SYSCALLS:
        return None
    return Filter(program(machine))


def works(filt: Filter) -> bool:
    """Whether the kernel applies the filter: a forked probe installs it and checks that a denied call (keyctl)
    fails with EPERM while an allowed one (getpid) works. Costs one fork, once per server."""
    machine = os.uname().machine
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            filt.install()
            libc = ctypes.CDLL(None, use_errno=True)
            refused = libc.syscall(SYSCALLS[machine]["keyctl"], 0, 0, 0, 0, 0) == -1
            code = 0 if refused and ctypes.get_errno() == errno.EPERM and os.getpid() > 0 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
