#!/usr/bin/env bash
# The GPU check of the torch or JAX backend, in one command, on a machine with a CUDA GPU, torch or
# jax with CUDA, numpy, CMake, ninja, pybind11 and scikit-build-core (the lent H100 machine:
# docs/benchmarks.md, "On a GPU"):
#
#   bash benchmarks/gpu/run.sh [OUT_DIR] [torch|jax]
#
# It builds tnt-comm there, then on 2 ranks sharing the GPU (tnt-launch --ranks-per-gpu 2) trains a
# small CNN with tnt on the backend against serial Keras on the same GPU (equal_job.py), and, on
# torch, times one staged gradient bucket (staging.py). Wheels that machine lacks
# (keras, namex, optree) are taken from .whl/ when it is there. Runs on CPUs too (without staging.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-/tmp/tnt-gpu}}
BACKEND=${2:-${TNT_GPU_BACKEND:-torch}}
case "$BACKEND" in torch|jax) ;; *) echo "run.sh: the backend is torch or jax, not $BACKEND" >&2; exit 2 ;; esac
SITE=${TNT_SITE:-/tmp/tnt-site}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT" "$SITE"
if ! "$PYTHON" -c "import keras, namex, optree" 2> /dev/null && compgen -G ".whl/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
echo "== building tnt-comm"
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation \
  --no-cache-dir --upgrade --target "$SITE" ./packages/tnt-comm
echo "built in $(( $(date +%s) - start )) s"
export PYTHONPATH="$SITE:$PWD/packages/tnt-keras/src:$PWD/packages/tnt-launch/src${PYTHONPATH:+:$PYTHONPATH}"
export KERAS_BACKEND=$BACKEND PYTHONUNBUFFERED=1 TNT_TIMEOUT_S=120
# JAX computes float64 only where asked to: equal_job.py's reference is float64.
if [ "$BACKEND" = jax ]; then export JAX_ENABLE_X64=1; fi
launch=("$PYTHON" -m tnt_launch -n 2)
gpu=0
if [ "$BACKEND" = torch ]; then
  has_gpu="import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
else
  has_gpu="import jax, sys; sys.exit(0 if jax.devices()[0].platform == 'gpu' else 1)"
fi
if "$PYTHON" -c "$has_gpu"; then
  gpu=1
  launch+=(--ranks-per-gpu 2)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
echo "== equality with serial Keras on $BACKEND"
"${launch[@]}" -- "$PYTHON" benchmarks/gpu/equal_job.py "$OUT"
if [ "$gpu" = 1 ] && [ "$BACKEND" = torch ]; then
  echo "== one staged gradient bucket"
  "${launch[@]}" -- "$PYTHON" benchmarks/gpu/staging.py "$OUT"
fi
"$PYTHON" - "$OUT/equal.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
ok = report["equal_within_bound"] and report["ranks_bitwise_equal"]
print("equality:", "PASS" if ok else "FAIL", {k: report[k] for k in ("tnt_vs_64", "serial32_vs_64", "bound")})
sys.exit(0 if ok else 1)
PY
