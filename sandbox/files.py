"""Files the sandboxed programs must not read: created readable by their owner only.

Run folders, the corpus database, the result cache and traces hold hidden tests and expected outputs. A program
runs under a uid of its own (process backend as root) or in a container, so the file mode is what keeps these
out of its reach when they sit anywhere it can see: folders 0700, files 0600, whatever the umask. SQLite
creates a database's -wal, -shm and -journal files with the database file's mode, so creating that file first
(owner_file) covers them.
"""

from __future__ import annotations

import os

DIR_MODE, FILE_MODE = 0o700, 0o600
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def owner_dir(path) -> str:
    """Create `path` (and missing parents) with the leaf readable by its owner only, whatever the umask (an
    existing folder keeps its mode: it may be a home or a shared folder). Returns the path as a string. Raises
    OSError as os.makedirs does."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        os.makedirs(path, mode=DIR_MODE, exist_ok=True)
        os.chmod(path, DIR_MODE)
    return path


def owner_file(path, *, sqlite: bool = False) -> str:
    """Create `path` empty if missing, mode 0600 (its folder must exist); an existing file we own loses group and
    other permissions, and with sqlite=True so do the database's side files. Returns the path as a string."""
    path = os.fspath(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    os.close(fd)
    for p in (path, *(path + s for s in SQLITE_SIDE_FILES)) if sqlite else (path,):
        _tighten(p, FILE_MODE)
    return path


def _tighten(path: str, mode: int) -> None:  # files only: never a folder the user chose to share
    try:
        st = os.lstat(path)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(path, st.st_mode & mode & 0o7777)
    except OSError:
        pass
