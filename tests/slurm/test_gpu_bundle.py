"""slurm/gpu_bundle.sh and the wheels slurm/gpu_check.sh installs, offline: the bundle's lists cover what the GPU
check imports, and gpu_check.sh installs a .whl/ folder ahead of the check when one is there (a wheel built in the
test), not when its wheels are for another Python, and touches nothing without one."""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import REPO

BUNDLE = REPO / "slurm" / "gpu_bundle.sh"
FIRST_PARTY = {"selfplay", "sandbox", "generator", "solver"}
# `python -m selfplay bench gpu-check`: the CLI imports the check's module by name
ENTRY = ("selfplay.cli", "selfplay.cli.bench", "selfplay.bench.gpu_check")
PY312_LINUX = {
    "python_version": "3.12",
    "python_full_version": "3.12.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "extra": "",
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def bash_list(name: str) -> list[str]:
    """The words of the bash array `name=( ... )` in gpu_bundle.sh, comments left out."""
    body = re.search(rf"^{name}=\((.*?)^\)", BUNDLE.read_text(), re.M | re.S)
    assert body, f"no {name}=( ... ) in {BUNDLE}"
    return [word for line in body.group(1).splitlines() for word in line.split("#")[0].split()]


def pinned() -> dict[str, str]:
    specs = bash_list("WHEELS")
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.]+", s) for s in specs), specs
    names = [norm(s.split("==")[0]) for s in specs]
    assert len(names) == len(set(names)), f"one version of each package: {specs}"
    return dict(zip(names, (s.split("==")[1] for s in specs)))


def module_file(name: str) -> Path | None:
    path = REPO / name.replace(".", "/")
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def imported(module: str, tree: ast.Module, everywhere: bool) -> set[str]:
    """The absolute names `tree` imports: everywhere (functions too), or at module level (try/if blocks included)."""
    package = module if module_file(module).name == "__init__.py" else module.rpartition(".")[0]
    if everywhere:
        nodes = list(ast.walk(tree))
    else:
        nodes = [n for st in tree.body for n in (ast.walk(st) if isinstance(st, (ast.Try, ast.If)) else [st])]
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def check_third_party_imports() -> dict[str, set[str]]:
    """Top-level third-party modules of the check's import closure in this repository -> the modules importing them.
    The check's own modules (ENTRY) count every import, the rest what they import at module level: what runs when
    the check runs (a function's lazy import elsewhere, e.g. vLLM or peft, serves other commands)."""
    seen: set[str] = set()
    todo, found = list(ENTRY), {}
    while todo:
        module = todo.pop()
        path = module_file(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        todo += [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]  # its packages
        for name in imported(module, ast.parse(path.read_text()), module in ENTRY):
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                todo.append(name)
            elif top and top != "__future__" and top not in sys.stdlib_module_names:
                found.setdefault(top, set()).add(module)
    assert "selfplay.bench.gpu_check" in seen and "selfplay.runtime.config" in seen, seen
    return found


def distribution(module: str) -> str:
    """The distribution that provides import name `module` (where it is installed here; else the name itself)."""
    dists = importlib.metadata.packages_distributions().get(module)
    return norm(dists[0]) if dists else norm(module)


def test_bundle_covers_every_third_party_import_of_the_check():
    wheels, device = pinned(), {norm(n) for n in bash_list("DEVICE_HAS")}
    assert not set(wheels) & device, "a package both carried and on the image would shadow the image's own"
    imports = check_third_party_imports()
    assert {"torch", "transformers", "omegaconf", "deepspeed"} <= set(imports), imports
    uncovered = {m: sorted(by) for m, by in imports.items() if distribution(m) not in {*wheels, *device}}
    assert not uncovered, f"imported by the GPU check, neither in WHEELS nor DEVICE_HAS of gpu_bundle.sh: {uncovered}"


def test_bundle_carries_what_its_wheels_need():
    """Each carried package's requirements (Python 3.12 on Linux, no extras) are carried or on the image: read from
    the copy installed here (the project's own dependencies: deepspeed, omegaconf, radon and theirs; where its version
    is not the one pinned its requirements stand in for the pin's, and gpu_bundle.sh checks the wheels themselves)."""
    wheels, device = pinned(), {norm(n) for n in bash_list("DEVICE_HAS")}
    checked, missing = [], []
    for name in wheels:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        checked.append(norm(name))
        for line in dist.requires or []:
            req = Requirement(line)
            if (req.marker is None or req.marker.evaluate(PY312_LINUX)) and norm(req.name) not in {*wheels, *device}:
                missing.append(f"{name} needs {req}")
    assert {"deepspeed", "omegaconf", "radon"} <= set(checked), checked  # installed with the project
    assert not missing, missing


PROBE = "gpubundleprobe"


def tiny_wheel(folder: Path) -> Path:
    """A one-module wheel (`gpubundleprobe.VALUE == 42`), written by hand: no build, no network."""
    files = {
        f"{PROBE}.py": b"VALUE = 42\n",
        f"{PROBE}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 1.0\n".encode(),
        f"{PROBE}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{n},{digest(d)},{len(d)}\n" for n, d in files.items()) + f"{PROBE}-1.0.dist-info/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{PROBE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in {**files, f"{PROBE}-1.0.dist-info/RECORD": record.encode()}.items():
            z.writestr(name, data)
    return path


@pytest.mark.parametrize("case", ["wheels", "other_python", "none"])
def test_gpu_check_installs_the_carried_wheels_first(tmp_path, case):
    checkout, site = tmp_path / "checkout", tmp_path / "site"
    if case != "none":
        tiny_wheel(checkout / ".whl")
        version = "2.7" if case == "other_python" else "{}.{}".format(*sys.version_info[:2])
        (checkout / ".whl" / "python-version").write_text(version + "\n")
    checkout.mkdir(exist_ok=True)
    # a stand-in interpreter: pip and the rest go to this Python, the check itself only reports the probe module
    fake = tmp_path / "python"
    report = f"try:\n import {PROBE} as p; print('probe', p.VALUE, p.__file__)\n"
    report += "except ImportError:\n print('probe missing')"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1 $2" = "-m selfplay" ]; then exec {sys.executable} -c "{report}"; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    env = {
        **os.environ,
        "PYTHON": str(fake),
        "SLURM_SUBMIT_DIR": str(checkout),
        "WHEEL_SITE": str(site),
        "PIP_NO_INDEX": "1",
    }
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", str(REPO / "slurm" / "gpu_check.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if case == "wheels":
        assert f"probe 42 {site}/{PROBE}.py" in proc.stdout, proc.stdout + proc.stderr
        assert "1 wheels of .whl/ installed" in proc.stdout, proc.stdout
    else:
        assert "probe missing" in proc.stdout and not site.exists(), proc.stdout + proc.stderr
        assert ("not installed" in proc.stdout) is (case == "other_python"), proc.stdout
