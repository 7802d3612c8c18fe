#!/usr/bin/env bash
# The one command to give a GPU machine: the GPU tests (pytest -m gpu) and bench/gpu.py,
# everything written under one folder, a summary printed at the end.
#
#   bash bench/gpu.sh [--only tests|bench] [--budget-s S] [OUT]
#
# OUT: the folder for the results (default: $OUT, which the device tool returns; else
# ./gpu-out). It receives at most 7 files: gpu-env.txt, gpu-tests.log, gpu-tests.jsonl (one
# line per comparison, near-tie margins included), gpu-bench.log, gpu-bench.json,
# gpu-bench.md, gpu-summary.txt.
#
# Wheels: where the machine lacks a package or has an older one (no network there), put
# wheels in .whl/ (or $VLMSPEC_WHEELS); they are installed into /tmp/vlmspec-site, which is
# put first on PYTHONPATH. A second call on the same machine finds the first call's
# packages there, so one call can bring what the other has no room for.
#
# Exit: 0 all passed; 1 a test or a bench section failed; 2 no CUDA GPU here (one line,
# nothing run).
set -uo pipefail
cd "$(dirname "$0")/.."
only=all
budget=${VLMSPEC_GPU_BUDGET_S:-180}
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only=$2; shift 2 ;;
    --budget-s) budget=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
out=${1:-${OUT:-gpu-out}}
py=${PYTHON:-python3}
wheels=${VLMSPEC_WHEELS:-.whl}
site=/tmp/vlmspec-site

if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "bench/gpu.sh: no CUDA GPU here (torch.cuda.is_available() is not True for $py): nothing run"
  exit 2
fi
mkdir -p "$out"
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$wheels"/*.whl 2>&1 | grep -v -i warning
fi
[ -d "$site" ] && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/vlmspec-inductor}

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  "$py" - <<'EOF' 2>&1
import importlib, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "cuda", torch.version.cuda,
      "|", torch.cuda.get_device_name(0))
for name in ("transformers", "tokenizers", "safetensors", "bitsandbytes", "accelerate", "av", "scipy"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"), m.__file__)
    except Exception as exc:
        print(name, "missing:", type(exc).__name__, exc)
EOF
} > "$out/gpu-env.txt"
cat "$out/gpu-env.txt"

tests_rc=skipped
bench_rc=skipped
if [ "$only" != bench ]; then
  timeout_opt=()
  "$py" -c 'import pytest_timeout' 2>/dev/null && timeout_opt=(--timeout=240)
  VLMSPEC_GPU_REPORT="$out/gpu-tests.jsonl" timeout "${VLMSPEC_GPU_TESTS_TIMEOUT_S:-300}" \
    "$py" -m pytest -o addopts= -m gpu tests/test_gpu.py -p no:cacheprovider -rA --show-capture=no --durations=0 \
    "${timeout_opt[@]}" 2>&1 | tee "$out/gpu-tests.log"
  tests_rc=${PIPESTATUS[0]}
fi
if [ "$only" != tests ]; then
  timeout "$((${budget%.*} + 120))" "$py" bench/gpu.py --out "$out" --budget-s "$budget" 2>&1 \
    | tee "$out/gpu-bench.log"
  bench_rc=${PIPESTATUS[0]}
fi

{
  echo "== bench/gpu.sh summary ($(head -2 "$out/gpu-env.txt" | tail -1))"
  if [ "$tests_rc" != skipped ]; then
    echo "tests: exit $tests_rc; $(grep -E '^(=+ )?[0-9]+ (passed|failed)|passed|failed' "$out/gpu-tests.log" | tail -1)"
    [ -f "$out/gpu-tests.jsonl" ] && echo "comparisons: $(grep -c . "$out/gpu-tests.jsonl"), differing (near-ties): $(grep -c '"equal": false' "$out/gpu-tests.jsonl")"
  fi
  if [ "$bench_rc" != skipped ]; then
    echo "bench: exit $bench_rc; $(grep '^\[gpu.py\] [0-9]* sections' "$out/gpu-bench.log" | tail -1)"
    [ -f "$out/gpu-bench.md" ] && cat "$out/gpu-bench.md"
  fi
} | tee "$out/gpu-summary.txt"
for rc in "$tests_rc" "$bench_rc"; do
  [ "$rc" = skipped ] || [ "$rc" = 0 ] || exit 1
done
exit 0
