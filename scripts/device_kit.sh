#!/usr/bin/env bash
# The device kit: Python 3.12 wheels of what titan_morph needs beyond a GPU machine's image that has
# torch (2.11+, CUDA) and the common scientific stack but reaches no package registry (the lent H100:
# numpy, pandas, pyarrow, tensorboard, pytest, tokenizers, safetensors, huggingface-hub, fsspec, ...;
# no torchtitan, tyro, torchdata, datasets). Run it here, where a registry is reachable:
#
#   scripts/device_kit.sh        # -> .device-kit/ (ignored by git; at most 40 MiB)
#
# then carry .device-kit to that machine and run scripts/gpu_check.sh there. The wheels are
# fetched without their dependencies (pip's --no-deps): KIT lists every one the image lacks, and the
# check below fails when a wheel of the kit needs a package that is neither in the kit nor in IMAGE.
# Env: PYTHON (the pip that downloads; default python3), KIT_DIR (default <repo>/.device-kit).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KIT_DIR="${KIT_DIR:-$ROOT/.device-kit}"
PYTHON="${PYTHON:-python3}"
MAX_MIB=40

# what the project needs that the image lacks, pinned to the versions the CPU suite runs
KIT=(
    torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 docstring-parser==0.17.0 typeguard==4.6.1
    datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 tomli==2.5.0
)
# what the kit's wheels need and the image has (its python3's packages, as listed for the lent machine)
IMAGE="torch numpy pandas pyarrow tensorboard pytest tokenizers safetensors huggingface-hub fsspec filelock
    requests urllib3 tqdm xxhash pyyaml packaging typing-extensions einops pillow matplotlib aiohttp httpx"

tmp="$(mktemp -d "${KIT_DIR}.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$tmp" "${KIT[@]}" \
    || { echo "device_kit: pip could not download the kit (a package registry must be reachable here)" >&2; exit 1; }

"$PYTHON" - "$tmp" "$IMAGE" <<'EOF'
import re, sys, zipfile
from pathlib import Path

kit, image = Path(sys.argv[1]), set(sys.argv[2].split())
def norm(name): return re.sub(r"[-_.]+", "-", name).lower()
wheels = sorted(kit.glob("*.whl"))
have = {norm(w.name.split("-")[0]) for w in wheels} | {norm(n) for n in image}
missing = []
for w in wheels:
    with zipfile.ZipFile(w) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = line.split(":", 1)[1].strip()
            if "extra ==" in req or re.search(r"python_version\s*<\s*['\"]3\.(1[01]|[0-9])['\"]", req):
                continue  # an extra, or only for Pythons before 3.12
            name = norm(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
            if name not in have:
                missing.append(f"{w.name}: {req}")
if missing:
    sys.exit("device_kit: needed by the kit but neither in it nor in the image:\n  " + "\n  ".join(missing))
EOF

size_kib="$(du -sk "$tmp" | cut -f1)"
if [ "$size_kib" -gt $((MAX_MIB * 1024)) ]; then
    echo "device_kit: the kit is $((size_kib / 1024)) MiB, more than $MAX_MIB MiB" >&2
    exit 1
fi
rm -rf "$KIT_DIR"
mv "$tmp" "$KIT_DIR"
trap - EXIT
chmod 755 "$KIT_DIR"
ls "$KIT_DIR" > "$KIT_DIR/MANIFEST"
echo "device_kit: $(ls "$KIT_DIR"/*.whl | wc -l) wheels, $size_kib KiB in $KIT_DIR" >&2
