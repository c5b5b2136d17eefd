#!/usr/bin/env bash
# Reliability on the GPU, one run: the threads / misaligned-operand tests, then
# compute-sanitizer's memcheck and racecheck over a small subset of tests/gpu (every python
# engine once, small shapes). Appends what it saw to bench/results/reliability.md.
#
#   bash tools/reliability_gpu.sh        (from the repository root, on the GPU machine)
#
# memcheck runs with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so every tensor is its own
# allocation and a read past one is reported rather than landing in the caching pool.
# Without compute-sanitizer the sanitizer steps are reported as skipped, not failed. When
# $OUT names a directory (the lent GPU machine's), the results file and logs are copied there.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
RESULTS=${RESULTS:-bench/results/reliability.md}
LOG=$(mktemp -d "${TMPDIR:-/tmp}/reliability_gpu.XXXXXX")
PER_RUN=${PER_RUN:-120}   # seconds per sanitizer run (Triton compiles under the tool too)

SUBSET=(
  "tests/gpu/test_threads_gpu.py::test_a_misaligned_operand_is_refused_or_served_correctly"
  "tests/gpu/test_sdpa_gpu.py::test_engines_plan_build_execute_on_gpu"
  "tests/gpu/test_gemm_gpu.py::test_bf16_bias_gelu_tanh[ptr-odd-N-col]"
)
# memcheck only: the torch ops fed hostile cu_seqlens tables (every byte they may touch is
# the caller's), then the linear-attention device-side table checks
MEMCHECK_ONLY=(
  "tests/gpu/test_op_races_gpu.py::test_sdpa_bad_tables_poison_and_touch_nothing_else"
  "tests/gpu/test_op_races_gpu.py::test_linear_attention_bad_tables_poison"
  "tests/gpu/test_gdn_gpu.py::test_malformed_cu_seqlens_gives_nan_outputs_without_a_sync"
  "tests/gpu/test_gdn_gpu.py::test_state_indices_minus_one_and_out_of_range_bf16"
)

find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2>/dev/null)" \
           "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" \
           /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
           "$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)"/nvidia/cuda_sanitizer_api/compute-sanitizer/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
versions=$(python3 -c 'import torch, triton; print(f"torch {torch.__version__}, triton {triton.__version__}")' 2>/dev/null)
{
  echo
  echo "## GPU reliability ($(date -u +%Y-%m-%d), ${gpu:-no nvidia-smi}, ${versions})"
  echo
  echo "\`bash tools/reliability_gpu.sh\`"
  echo
} >>"$RESULTS"

status=0
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_threads_gpu.py tests/gpu/test_op_races_gpu.py \
  >"$LOG/threads.txt" 2>&1
rc=$?
[ "$rc" -ne 0 ] && status=1
echo "- threads, torch-op races on one stream, misaligned operands (tests/gpu/test_threads_gpu.py, test_op_races_gpu.py): rc=$rc, $(tail -1 "$LOG/threads.txt")" | tee -a "$RESULTS"

if sanitizer=$(find_sanitizer); then
  echo "- compute-sanitizer: $("$sanitizer" --version 2>/dev/null | tail -1) ($sanitizer)" | tee -a "$RESULTS"
  for tool in memcheck racecheck; do
    extra=() tests=("${SUBSET[@]}")
    [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
    [ "$tool" = memcheck ] && tests+=("${MEMCHECK_ONLY[@]}")
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$PER_RUN" "$sanitizer" --tool "$tool" "${extra[@]}" \
      --target-processes all --print-limit 20 --error-exitcode 99 \
      python3 -m pytest -q -p no:cacheprovider -x "${tests[@]}" >"$LOG/$tool.txt" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOG/$tool.txt" | tail -1)
    case $rc in
      0) verdict="clean" ;;
      99) verdict="ERRORS REPORTED"; status=1 ;;
      124) verdict="timed out after ${PER_RUN} s" ;;
      *) verdict="rc=$rc" ;;
    esac
    echo "- $tool over ${#tests[@]} tests: $verdict; ${summary:-no summary line}; $(grep -E '^[0-9]+ (passed|failed)|[0-9]+ (passed|failed) in' "$LOG/$tool.txt" | tail -1)" | tee -a "$RESULTS"
    if [ "$rc" -ne 0 ]; then
      grep -E "^=+ (Invalid|Race|Error|Program hit)" "$LOG/$tool.txt" | sort | uniq -c | head -10 | sed 's/^/    /' | tee -a "$RESULTS"
    fi
  done
else
  echo "- compute-sanitizer: not found on this machine (PATH, \$CUDA_HOME, /usr/local/cuda*, the nvidia-cuda-sanitizer-api wheel); memcheck and racecheck skipped" | tee -a "$RESULTS"
fi
echo "logs: $LOG"
# On the lent GPU machine only $OUT comes back: the results file and the logs go there too.
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$RESULTS" "$LOG"/*.txt "$OUT"/
fi
exit "$status"
