#!/usr/bin/env bash
# Wheels for the GPU check on a machine without network: run HERE, where pip reaches its registry, to fill .whl/
# with what a GPU image that holds torch and transformers (Python 3.12, manylinux x86_64) lacks for
# `bash slurm/gpu_check.sh` (selfplay/bench/gpu_check.py): omegaconf (the config), DeepSpeed and what it needs that
# such an image lacks, and radon for --selfplay (the solver's static check). Not vLLM. Carry .whl/ with the checkout;
# slurm/gpu_check.sh installs it into a folder on PYTHONPATH before the check. One version of each package.
#
#   bash slurm/gpu_bundle.sh          # .whl/ (ignored by git); prints each wheel and the total, fails over 48 MiB
#
# DeepSpeed ships as a source distribution: built here as a pure-Python wheel (DS_BUILD_OPS=0, no CUDA op: our
# DeepSpeed configs ask for torch's AdamW, `torch_adam`); the build imports this machine's torch. Each wheel's
# Requires-Dist (for Python 3.12 on Linux, extras left out) must be a wheel below or in DEVICE_HAS, else this fails.
# tests/slurm/test_gpu_bundle.py reads the two lists.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=.whl
TARGET_PYTHON=3.12  # the GPU image's Python: the compiled wheel (pydantic-core) is for it
LIMIT_MIB=48        # what travels with a device call is 64 MiB, the checkout included

WHEELS=(
  omegaconf==2.4.0          # selfplay.runtime.config (antlr4 is vendored in omegaconf since 2.4)
  deepspeed==0.19.8         # ZeRO-2 / ZeRO-3 lines of the check (built here, see above)
  hjson==3.1.0              # deepspeed
  pydantic==2.13.4          # deepspeed
  pydantic-core==2.46.4     # pydantic (compiled for cp312)
  annotated-types==0.7.0    # pydantic
  typing-inspection==0.4.2  # pydantic
  radon==6.0.1              # --selfplay: the solver's static check
  mando==0.7.1              # radon
)
# On the GPU image already (python3 there: /opt/torch/.venv): never carried, a second copy would shadow its own. Only
# the packages the check and the wheels above need are named.
DEVICE_HAS=(
  torch transformers accelerate safetensors tokenizers huggingface-hub numpy triton tqdm
  pyyaml attrs packaging psutil einops msgpack ninja py-cpuinfo typing-extensions six colorama
)

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
quiet() { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }  # a registry mirror's noise
binary=() deepspeed=
for spec in "${WHEELS[@]}"; do
  if [ "${spec%%==*}" = deepspeed ]; then deepspeed=$spec; else binary+=("$spec"); fi
done
platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do platforms+=(--platform "${p}_x86_64"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET_PYTHON" --implementation cp \
  "${platforms[@]}" -d "$DEST" "${binary[@]}" 2> >(quiet)
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$deepspeed" 2> >(quiet)
echo "$TARGET_PYTHON" >"$DEST/python-version"  # slurm/gpu_check.sh installs them only under this Python

# one wheel per package, each Requires-Dist covered, and the whole set installs for the target Python
"$PY" - "$DEST" "$TARGET_PYTHON" "${WHEELS[*]}" "${DEVICE_HAS[*]}" <<'PY'
import re, sys, zipfile
from email.parser import Parser
from pathlib import Path
from packaging.requirements import Requirement

dest, target, wheels, device = Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
pinned = {norm(s.split("==")[0]): s.split("==")[1] for s in wheels}
env = {"python_version": target, "python_full_version": target + ".0", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
found, missing = {}, []
for whl in sorted(dest.glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    name = norm(meta["Name"])
    if name in found:
        sys.exit(f"gpu_bundle.sh: two wheels of {name}: {found[name]} and {whl.name}")
    found[name] = whl.name
    if pinned.get(name) != meta["Version"]:
        sys.exit(f"gpu_bundle.sh: {whl.name} is not a wheel asked for ({pinned.get(name)})")
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if (req.marker is None or req.marker.evaluate(env)) and norm(req.name) not in {*pinned, *map(norm, device)}:
            missing.append(f"{whl.name} needs {req}")
if set(found) != set(pinned):
    sys.exit(f"gpu_bundle.sh: no wheel of {sorted(set(pinned) - set(found))}")
if missing:
    sys.exit("gpu_bundle.sh: neither a wheel here nor on the GPU image:\n  " + "\n  ".join(missing))
PY
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
"$PY" -m pip install -q --no-index --no-deps --no-compile --only-binary=:all: --python-version "$TARGET_PYTHON" \
  --implementation cp "${platforms[@]}" --target "$site" "$DEST"/*.whl
ls "$site" | grep -c '\.dist-info$' | xargs -I{} echo "installed for Python $TARGET_PYTHON into a fresh folder: {} packages"

ls -l "$DEST"/*.whl | awk '{printf "%9.2f MiB  %s\n", $5 / 1048576, $NF}'
bytes=$(cat "$DEST"/*.whl | wc -c)
echo "$(ls "$DEST"/*.whl | wc -l) wheels, $(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1048576 }') MiB in $DEST/"
if [ "$bytes" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "gpu_bundle.sh: over $LIMIT_MIB MiB: it would not travel with the checkout" >&2
  exit 1
fi
