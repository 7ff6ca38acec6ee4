#!/usr/bin/env bash
# The GPU check in one go, for a GPU machine that cannot download anything:
# ferry is not installed there, so whatever it imports and the machine lacks
# is installed (into a temporary folder, nothing else touched) from wheels
# fetched beforehand with `pip download` (benchmarks/README.md shows how).
#
#   benchmarks/gpu_check.sh [WHEELS_DIR] [OUT_DIR]
set -u
WHEELS=${1:-.cache/gpu_wheels}
OUT=${2:-.}
PY=${PYTHON:-python3}
SITE=${FERRY_SITE:-$(mktemp -d)}  # FERRY_SITE: keep the installs for later commands
need=()
for pair in pydantic:pydantic pydantic_core:pydantic_core annotated_types:annotated_types \
    typing_extensions:typing_extensions typing_inspection:typing_inspection structlog:structlog \
    ml_dtypes:ml_dtypes cuda.bindings:cuda_bindings cuda.pathfinder:cuda_pathfinder pytest:pytest \
    pluggy:pluggy iniconfig:iniconfig packaging:packaging pytest_asyncio:pytest_asyncio; do
  "$PY" -c "import ${pair%%:*}" 2>/dev/null || need+=("${pair##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing from $WHEELS into $SITE: ${need[*]}"
  "$PY" -m pip install -q --no-index --no-deps --find-links "$WHEELS" --target "$SITE" "${need[@]}" || exit 2
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
"$PY" -m benchmarks.gpu_check --out "$OUT/gpu_check.json"
check=$?
"$PY" -m pytest -q -rs --noconftest -p no:cacheprovider tests/workers/repository/test_optimization_config.py \
  tests/workers/backends/test_onnxruntime_gpu.py tests/workers/backends/test_tensorrt.py 2>&1 | tee "$OUT/gpu_tests.txt"
tests=${PIPESTATUS[0]}
echo "gpu_check exit $check, tests exit $tests"
[ "$check" -eq 0 ] && [ "$tests" -eq 0 ]
