"""Building the Docker sandbox image, offline when no registry is reachable.

Two recipes give an equivalent image (a Python 3.11 interpreter with its full standard library, nothing else):
- "debootstrap": `debootstrap --variant=minbase --include=python3 bookworm` into a folder, trimmed, packed as a
  tarball cached under `/var/cache/selfplay`, then `docker import`ed. Needs root, `debootstrap` and a Debian mirror
  (the apt mirror a machine installs packages from), but no container registry. Debian's `python3`, not
  `python3-minimal`, because the latter lacks stdlib modules such as `resource`.
- "dockerfile": `sandbox/image/Dockerfile` (`FROM python:3.11-slim`), for machines that can pull from a registry.
"auto" picks "dockerfile" when the registry answers and "debootstrap" otherwise.

The image carries a label with a hash of its recipe, so a second build is a no-op (`force=True` rebuilds). After a
build the image is checked by running the interpreter in a locked-down container. The fork-server is not baked in:
`sandbox/docker_backend.py` bind-mounts it at run time.

Only the stdlib and the docker SDK are used here (the `sandbox` package rule).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from sandbox.errors import SandboxError, SandboxUnavailable

DEFAULT_IMAGE = "selfplay-sandbox:latest"  # the image the docker backend uses unless told otherwise
DOCKERFILE_DIR = Path(__file__).resolve().parent  # build context of the "dockerfile" recipe
DEBIAN_SUITE = "bookworm"  # Debian release debootstrap installs (python3 is 3.11 there)
DEBIAN_PACKAGES = ("python3",)  # on top of minbase; python3 pulls libpython3.11-stdlib (resource, sqlite3, ...)
DEFAULT_MIRROR = "http://deb.debian.org/debian"  # the apt mirror debootstrap downloads from
DEFAULT_CACHE_DIR = "/var/cache/selfplay"  # where the debootstrap rootfs tarball is kept between builds
BASE_IMAGE = "python:3.11-slim"  # the Dockerfile's FROM (used to test whether a registry is reachable)
RECIPE_LABEL = "selfplay.sandbox.recipe"  # image label holding the recipe hash (idempotent builds)
RECIPE_VERSION = "1"  # bump when the image contents should change for the same inputs
METHODS = ("auto", "debootstrap", "dockerfile")
# folders dropped from the debootstrap rootfs: package caches and documentation (about a third of its size)
TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")
# what an imported image needs that a Dockerfile's base image would have set
IMPORT_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    "WORKDIR /tmp",
    'CMD ["python3"]',
)
# run inside the finished image as the sandbox user: fails when a module the fork-server needs is missing
SMOKE_PROGRAM = "import resource, socket, json, signal, tempfile, sys; print(sys.version.split()[0])"

Log = Callable[[str], None]


class ImageBuildError(SandboxError):
    """The sandbox image could not be built; the message says why and what to try."""


def connect(timeout_s: float = 60.0):
    """A docker SDK client for the local engine, or SandboxUnavailable saying how to start it."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - docker is an install requirement
        raise SandboxUnavailable("the docker SDK is not installed: pip install docker") from exc
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except Exception as exc:
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise SandboxUnavailable(
            f"Docker engine not reachable ({reason}): start it (`dockerd &` as root, or `systemctl start docker`) "
            f"and check `docker info`"
        ) from None
    return client


def image_recipe(client, name: str) -> str | None:
    """The recipe label of image `name`, "" when it has none, None when the image does not exist."""
    import docker

    try:
        image = client.images.get(name)
    except docker.errors.ImageNotFound:
        return None
    return (image.labels or {}).get(RECIPE_LABEL, "")


def recipe_hash(method: str, suite: str = DEBIAN_SUITE) -> str:
    """Hash of everything that decides the image contents for `method` (stored as a label)."""
    if method == "dockerfile":
        parts = [(DOCKERFILE_DIR / "Dockerfile").read_text()]
    else:
        parts = [suite, ",".join(DEBIAN_PACKAGES), ",".join(TRIM), "\n".join(IMPORT_CHANGES)]
    digest = hashlib.sha256("\0".join([RECIPE_VERSION, method, *parts]).encode()).hexdigest()[:16]
    return f"{method}-{digest}"


def registry_reachable(timeout_s: float = 15.0) -> bool:
    """Whether the engine can reach the registry holding the Dockerfile's base image (offline it fails fast, on
    a network that drops packets after `timeout_s`)."""
    try:
        connect(timeout_s).api.inspect_distribution(BASE_IMAGE)
        return True
    except Exception:  # noqa: BLE001 - any failure means: build without a registry
        return False


def build_image(
    name: str = DEFAULT_IMAGE,
    method: str = "auto",
    *,
    mirror: str = DEFAULT_MIRROR,
    cache_dir: str = DEFAULT_CACHE_DIR,
    force: bool = False,
    log: Log = print,
) -> dict:
    """Build image `name` by `method` unless an image with the same recipe exists. Returns a summary dict."""
    if method not in METHODS:
        raise ImageBuildError(f"unknown image build method {method!r}: use one of {', '.join(METHODS)}")
    client = connect()
    existing = image_recipe(client, name)
    wanted = [recipe_hash(m) for m in (("debootstrap", "dockerfile") if method == "auto" else (method,))]
    if existing in wanted and not force:
        log(f"image {name} is up to date (recipe {existing}); nothing to do (--force rebuilds)")
        return {"name": name, "method": existing.split("-")[0], "recipe": existing, "built": False}
    if method == "auto":
        log(f"checking whether a registry is reachable (looking up {BASE_IMAGE}) ...")
        method = "dockerfile" if registry_reachable() else "debootstrap"
        log(f"-> {'registry reachable' if method == 'dockerfile' else 'no registry'}: building by {method}")
    recipe = recipe_hash(method)
    if method == "dockerfile":
        _build_from_dockerfile(client, name, recipe, log)
    else:
        tarball = debootstrap_rootfs(cache_dir, mirror=mirror, log=log)
        _import_rootfs(client, tarball, name, recipe, log)
    version = smoke_test(client, name)
    log(f"image {name} ready: python {version} (recipe {recipe})")
    return {"name": name, "method": method, "recipe": recipe, "built": True, "python": version}


def debootstrap_rootfs(
    cache_dir: str = DEFAULT_CACHE_DIR, *, mirror: str = DEFAULT_MIRROR, suite: str = DEBIAN_SUITE, log: Log = print
) -> Path:
    """A tarball of a trimmed minbase Debian root with python3, made once and then reused from `cache_dir`."""
    cache = Path(cache_dir)
    tarball = cache / f"rootfs-{recipe_hash('debootstrap', suite)}.tar"
    if tarball.exists():
        log(f"using cached root filesystem {tarball}")
        return tarball
    if shutil.which("debootstrap") is None:
        raise ImageBuildError(
            "debootstrap is not installed: apt-get install debootstrap "
            "(or build from the Dockerfile with --method dockerfile where a registry is reachable)"
        )
    if os.geteuid() != 0:
        raise ImageBuildError(
            "debootstrap needs root: run `selfplay sandbox build-image` as root "
            "(or use --method dockerfile where a registry is reachable)"
        )
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="rootfs-build-") as work:
        root = Path(work) / "root"
        log(f"debootstrap --variant=minbase --include={','.join(DEBIAN_PACKAGES)} {suite} (from {mirror}) ...")
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", suite, str(root), mirror]
        _run_logged(cmd, log, prefix="  debootstrap: ")
        for rel in TRIM:
            shutil.rmtree(root / rel, ignore_errors=True)
            (root / rel).mkdir(parents=True, exist_ok=True)
        partial = Path(work) / "rootfs.tar"
        log(f"packing root filesystem into {tarball} ...")
        proc = subprocess.run(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise ImageBuildError(f"tar failed packing the root filesystem: {_last_line(proc.stderr)}")
        os.replace(partial, tarball)  # atomic: a tarball in the cache is always complete
    return tarball


def _run_logged(cmd: list[str], log: Log, prefix: str) -> None:
    """Run `cmd`, logging the first line of each stage (debootstrap prints one line per package and stage)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()
    tail: list[str] = []
    count = 0
    for line in proc.stdout or ():
        line = line.rstrip()
        count += 1
        tail = (tail + [line])[-5:]
        words = line.split()
        if words[:1] == ["I:"] and len(words) > 1 and words[1] not in seen:
            seen.add(words[1])
            log(f"{prefix}{line}{' ...' if len(words) > 2 else ''}")
    if proc.wait() != 0:
        raise ImageBuildError(f"{cmd[0]} failed (exit {proc.returncode}): {' | '.join(tail[-2:])}")
    log(f"{prefix}done ({count} lines of output)")


def _import_rootfs(client, tarball: Path, name: str, recipe: str, log: Log) -> None:
    from docker.utils import parse_repository_tag

    repository, tag = parse_repository_tag(name)
    log(f"docker import {tarball.name} -> {name} ...")
    changes = [*IMPORT_CHANGES, f"LABEL {RECIPE_LABEL}={recipe}"]
    try:
        client.api.import_image_from_file(str(tarball), repository=repository, tag=tag or "latest", changes=changes)
    except Exception as exc:
        raise ImageBuildError(f"docker import failed: {_last_line(str(exc))}") from None


def _build_from_dockerfile(client, name: str, recipe: str, log: Log) -> None:
    log(f"docker build {DOCKERFILE_DIR}/Dockerfile -> {name} ...")
    try:
        for chunk in client.api.build(
            path=str(DOCKERFILE_DIR), tag=name, rm=True, decode=True, pull=True, labels={RECIPE_LABEL: recipe}
        ):
            if "error" in chunk:
                raise ImageBuildError(
                    f"docker build failed: {_last_line(chunk['error'])} (no registry? use --method debootstrap)"
                )
            text = chunk.get("stream", "").strip()
            if text.startswith("Step "):
                log("  " + text)
    except ImageBuildError:
        raise
    except Exception as exc:
        raise ImageBuildError(
            f"docker build failed: {_last_line(str(exc))} (no registry? use --method debootstrap)"
        ) from None


def smoke_test(client, name: str) -> str:
    """Run the interpreter in the image as the sandbox user with no network; return its version."""
    try:
        out = client.containers.run(
            name,
            ["python3", "-c", SMOKE_PROGRAM],
            remove=True,
            network_mode="none",
            user="65534:65534",
            read_only=True,
            cap_drop=["ALL"],
        )
    except Exception as exc:
        raise ImageBuildError(f"image {name} fails its check ({SMOKE_PROGRAM!r}): {_last_line(str(exc))}") from None
    return out.decode().strip()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"
