#!/usr/bin/env bash
# The gpu pool's device check: one command, on a machine with an NVIDIA GPU, from the
# repository root. It prints what it finds and leaves its logs and tables in OUT_DIR.
#
#   tests/gpu/device_check.sh [OUT_DIR]        # default: $OUT, else /tmp/weir-device-check
#
# What it needs: python3 with a CUDA build of torch. Weir's other dependencies come from
# .whl/ when that folder is there (tests/gpu/wheels.sh fills it, for a machine that reaches
# no package index), else from the package index (pip install -e '.[worker,gpu,dev]').
# onnxruntime-gpu and tensorrt are used where installed, onnxruntime-gpu also from the parts
# under .whl-parts/ (ORT_GPU=1 tests/gpu/wheels.sh says which call carries which); their
# tests and bench rows are skipped, saying so, where they are not.
#
# Steps: the GPU and the runtimes seen; the example models the GPU tests serve (and a
# TensorRT engine, in the tests, where tensorrt is installed); the `gpu` tests
# (tests/gpu/test_gpu_pool.py); the benchmark's GPU section (bench/gpu.py), whose table
# goes into bench/README.md; the gateway-scaling run (bench/scaling.py: tiny_mlp on the
# machine's cores with 1, 2, 4 and 8 gateway processes, the best of two alternating rounds,
# about 3 minutes), whose table goes there too; the gateway floor (bench/floor.py, about 50 s).
# On the lent H200 with torch alone the whole check took 4½ minutes with one scaling round
# (2026-12-04), plus the machine's start: about 6 with two.
#
# STEPS="tests scaling" (any of tests, gpu-bench, scaling, floor) runs only those after the
# install and the models, for a rerun of part of it; each step has its own time limit
# (TESTS_TIMEOUT_S, GPU_BENCH_TIMEOUT_S, SCALING_TIMEOUT_S, FLOOR_TIMEOUT_S), so one that
# hangs leaves the others their time.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:-${OUT:-/tmp/weir-device-check}}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
status=0

step() { echo; echo "== $* ($(date -u +%T))"; }
# STEPS picks what runs after the install and the models (a rerun of part of the check).
STEPS=${STEPS:-tests gpu-bench scaling floor}
wanted() { [[ " $STEPS " == *" $1 "* ]]; }

step "the GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || status=1
"$PYTHON" - <<'PY' || exit 1
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0))
PY

step "installing Weir's dependencies"
if [ -d .whl ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/weir-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/weir-site:$PWD
else
    "$PYTHON" -m pip install -q -e '.[worker,gpu,dev]' || exit 1
    export PYTHONPATH=$PWD
fi
# onnxruntime-gpu in parts (ORT_GPU=1 tests/gpu/wheels.sh), carried one a call: joined and
# put ahead of the image's CPU onnxruntime. A part missing leaves the CPU build (its tests
# skip, saying so).
if [ -d .whl-parts ]; then
    if wheel=$("$PYTHON" tests/gpu/wheel_parts.py join .whl-parts /tmp/weir-parts) &&
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target /tmp/weir-ort-gpu "$wheel"; then
        export PYTHONPATH=/tmp/weir-ort-gpu:$PYTHONPATH
    else
        echo "onnxruntime-gpu not installed: its tests and bench rows are skipped"
    fi
fi
"$PYTHON" - <<'PY' || exit 1
import importlib, importlib.util
for name in ("torch", "onnxruntime", "tensorrt", "pynvml"):
    found = importlib.util.find_spec(name) is not None
    version = getattr(importlib.import_module(name), "__version__", "?") if found else "-"
    extra = ""
    if name == "onnxruntime" and found:
        extra = " providers: " + ", ".join(importlib.import_module(name).get_available_providers())
    print(f"{name:12} {version}{extra}")
import weir.cli  # noqa: F401  every Weir import resolves
PY

step "building the example models the GPU tests serve"
"$PYTHON" examples/build_models.py --models tiny_mlp wide_mlp bert_mini tiny_mlp_onnx \
    bert_mini_onnx || exit 1

wanted tests && step "the gpu tests" && {
timeout "${TESTS_TIMEOUT_S:-300}" "$PYTHON" -m pytest tests/gpu -m gpu -v -rs \
    -p no:cacheprovider -W default --timeout 300 2>&1 | tee "$OUT_DIR/gpu-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

wanted gpu-bench && step "the benchmark's GPU section" && {
timeout "${GPU_BENCH_TIMEOUT_S:-300}" "$PYTHON" -m bench.gpu --out "$OUT_DIR" 2>&1 | tee "$OUT_DIR/bench-gpu.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

if wanted scaling || wanted floor; then
    step "gateway scaling: tiny_mlp with 1, 2, 4 and 8 gateway processes; the gateway floor"
    tools=$PWD/.whl/tools
    if [ -f "$tools/wrk" ]; then
        chmod +x "$tools/wrk"  # a copy may lose its mode
        # On PATH through a wrapper that gives wrk alone the carried libraries: Weir's own
        # processes keep the image's.
        mkdir -p /tmp/weir-wrk
        printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$tools" "$tools/wrk" \
            > /tmp/weir-wrk/wrk
        chmod +x /tmp/weir-wrk/wrk
        if seen=$(/tmp/weir-wrk/wrk -v 2>&1; true) && grep -q '^wrk ' <<<"$seen"; then
            export PATH=/tmp/weir-wrk:$PATH
            echo "load: the carried wrk (${seen%%$'\n'*})"
        else
            echo "the carried wrk does not run here, so the load is bench.http_load: $seen"
        fi
    fi
fi
wanted scaling && {
timeout "${SCALING_TIMEOUT_S:-300}" "$PYTHON" -m bench.scaling --out "$OUT_DIR" \
    --load-threads "${LOAD_THREADS:-4}" --rounds "${SCALING_ROUNDS:-2}" 2>&1 \
    | tee "$OUT_DIR/bench-scaling.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
# The floor of a Python gateway on this machine's cores, beside Weir's gateway.
wanted floor && {
timeout "${FLOOR_TIMEOUT_S:-120}" "$PYTHON" -m bench.floor --out "$OUT_DIR" 2>&1 \
    | tee "$OUT_DIR/bench-floor.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

step "done: $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
