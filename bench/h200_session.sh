#!/usr/bin/env bash
# One device call that checks and times every topic on the H200, in priority order, each
# step under its own time cap so the whole call ends inside the device limit. Results and
# results are packed into $OUT/session.tgz (the device tool brings back at most 8 files):
#   gpu_*.log      tests/gpu, one suite each, + the GPU autotune case (the correctness gate)
#   demo.log       the demo executing for real (`python -m cudnn_pygraph demo`)
#   backend.md     host time per execute (backend and python GEMM plans) vs NVIDIA's pygraph
#   gdn.md         GDN vs fla-core 0.6.0
#   sdpa_fwd.md    SDPA prefill/decode vs torch flash and the backend
#   classic_samples.md, classic_differential.md   issue 15's tables (topic parity)
# Run from the repository root with the wheels in .whl/ (../shared/tools/device-wheels).
# `bash bench/h200_session.sh --gate` runs the correctness gate and the demo only (~5 min);
# `bash bench/h200_session.sh --parity` runs the classic-parity topic only (~8 min): the
# GPU suites of the classic surface, NVIDIA's samples under both packages (a checkout of
# NVIDIA/cudnn-frontend's samples/python in .nv/, carried, never committed) and the
# random-graph differential.
set -u
GATE_ONLY=0; [ "${1:-}" = "--gate" ] && GATE_ONLY=1
PARITY_ONLY=0; [ "${1:-}" = "--parity" ] && PARITY_ONLY=1
# `--serving` is issue 16's one call (~9 min): the python plans' stream / capture /
# vs-backend suites and the engine-path SDPA checks (D=256, TMA plans), then every table
# its Measure section names: sdpa_host.md (host µs per execute of every engine's plan vs
# the backend plan vs NVIDIA's pygraph; the serving decode back to back at pages 16 / 64 vs
# the backend and torch), sdpa_ranked.md (the plan ranked first vs the fastest listed, by
# autotune's measurement, per cell) and sdpa_fwd.md (prefill TFLOP/s at the four shapes vs
# torch flash and the backend). `--reliability` runs the 32-thread and misaligned-operand
# suite with compute-sanitizer (bench/reliability_gpu.sh) and doctor (~4 min).
SERVING_ONLY=0; [ "${1:-}" = "--serving" ] && SERVING_ONLY=1
# `--cold-start` runs the compiled-plan cache's GPU suite and bench/cold_start.py (~5 min).
COLD_ONLY=0; [ "${1:-}" = "--cold-start" ] && COLD_ONLY=1
# `--sdpa-bwd` runs the SDPA backward GPU suite and bench/sdpa_bwd.py (~8 min).
SDPA_BWD_ONLY=0; [ "${1:-}" = "--sdpa-bwd" ] && SDPA_BWD_ONLY=1
RELIABILITY_ONLY=0; [ "${1:-}" = "--reliability" ] && RELIABILITY_ONLY=1
# `--kda` runs the kda GPU suite and bench/kda.py's row (a) against NVIDIA's kda engine and
# fla-core (~6 min).
KDA_ONLY=0; [ "${1:-}" = "--kda" ] && KDA_ONLY=1
# `--gdp` runs the gdp GPU suite and bench/gdp.py's row (a) at n = 2 and 3 against fla-core
# (~6 min).
GDP_ONLY=0; [ "${1:-}" = "--gdp" ] && GDP_ONLY=1
# `--gdn2` runs the gdn2 GPU suite and bench/kda.py --gdn2's row (a): GDN-2 vs our GDN (~5 min).
GDN2_ONLY=0; [ "${1:-}" = "--gdn2" ] && GDN2_ONLY=1
# `--cp` (on the nvidia-h200-x2 kind) runs the summary / context-parallel GPU suite (its
# NCCL case needs the two GPUs) and bench/cp.py under torchrun on both (~6 min).
CP_ONLY=0; [ "${1:-}" = "--cp" ] && CP_ONLY=1
# `--chain` runs the sequence-splitting GPU suite and bench/gdn.py --chain (one sequence of
# 131072 tokens, H16: chain vs uncut vs fla-core) (~6 min).
CHAIN_ONLY=0; [ "${1:-}" = "--chain" ] && CHAIN_ONLY=1
OUT=${OUT:-/tmp/out}
LOG=/tmp/session
mkdir -p "$OUT" "$LOG"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests
gcc --version | head -1
python3 setup.py -q build_ext --inplace > "$LOG/build.log" 2>&1 || { cat "$LOG/build.log"; exit 1; }
nvidia-smi -L
python3 -c "import torch, triton, cudnn; print('torch', torch.__version__, 'triton', triton.__version__, 'frontend', cudnn.__version__, 'libcudnn', cudnn.backend_version())"

step() {  # step NAME CAP_SECONDS COMMAND...
  local name=$1 cap=$2; shift 2
  local t0=$SECONDS
  timeout "$cap" "$@" > "$LOG/$name.log" 2>&1
  echo "== $name: rc=$? in $((SECONDS - t0)) s (cap $cap)"
  tail -4 "$LOG/$name.log"
}

if [ "$PARITY_ONLY" = 1 ]; then
  # the GPU suites run beside the samples and the differential (16 cores, one GPU)
  timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/classic \
    tests/gpu/test_classic_call_sequences_gpu.py tests/gpu/test_sdpa_backend_parity_gpu.py \
    tests/gpu/test_native_backend_lowering.py tests/gpu/test_serialize_gpu.py \
    tests/gpu/test_causal_conv1d_gpu.py > "$LOG/gpu_classic.log" 2>&1 &
  suites=$!
  step samples 90 python3 tools/classic_samples.py .nv/samples/python --jobs 12 --timeout 80 \
    --out "$LOG/classic_samples.md"
  step differential 175 python3 bench/classic_differential.py --graphs 2300 --budget-s 150 \
    --workers 14 --out "$LOG/classic_differential.md"
  wait "$suites"; echo "== gpu_classic: rc=$?"
  tail -n 12 "$LOG/gpu_classic.log"
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
if [ "$COLD_ONLY" = 1 ]; then
  step gpu_compiled_cache 200 python3 -m pytest -q -p no:cacheprovider -rfs \
    tests/gpu/test_compiled_cache_gpu.py
  step cold_start 280 python3 bench/cold_start.py --out "$LOG/cold_start.md"
  cat "$LOG/cold_start.md"
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
if [ "$KDA_ONLY" = 1 ]; then
  step gpu_kda 240 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_kda_gpu.py
  step kda 280 python3 bench/kda.py --only "(a)"
  tail -n 3 "$LOG"/gpu_*.log; cat "$LOG/kda.log"
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
if [ "$GDP_ONLY" = 1 ]; then
  step gpu_gdp 200 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_gdp_gpu.py
  step gdp 320 python3 bench/gdp.py --only "(a)"
  tail -n 3 "$LOG"/gpu_*.log; cat "$LOG/gdp.log"
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
if [ "$GDN2_ONLY" = 1 ]; then
  step gpu_gdn2 240 python3 -m pytest -q -p no:cacheprovider -rfs -s tests/gpu/test_gdn2_gpu.py
  step gdn2 120 python3 bench/kda.py --gdn2 --only "(a)"
  tail -n 3 "$LOG"/gpu_*.log; cat "$LOG/gdn2.log"
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
if [ "$SERVING_ONLY" = 1 ]; then
  step gpu_streams 100 python3 -m pytest -q -p no:cacheprovider -rfs \
    tests/gpu/test_plan_streams_gpu.py tests/gpu/test_sdpa_vs_backend_gpu.py \
    tests/gpu/test_sdpa_gpu.py -k "streams or backend or engine"
  step sdpa_host 140 python3 bench/sdpa_host.py --out "$LOG/sdpa_host.md"
  step sdpa_ranked 120 python3 bench/sdpa_ranked.py --out "$LOG/sdpa_ranked.md"
  step sdpa 130 python3 bench/sdpa_fwd.py --budget-s 90 --out "$LOG/sdpa_fwd.md"
  tail -n 3 "$LOG"/gpu_*.log
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
if [ "$RELIABILITY_ONLY" = 1 ]; then
  step reliability 220 env OUT= PER_RUN=45 RESULTS="$LOG/reliability.md" bash bench/reliability_gpu.sh
  step doctor 30 python3 -m cudnn_pygraph doctor
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
if [ "$SDPA_BWD_ONLY" = 1 ]; then
  step gpu_sdpa_bwd 300 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_sdpa_bwd_gpu.py
  step sdpa_bwd 280 python3 bench/sdpa_bwd.py --budget-s 220 --out "$LOG/sdpa_bwd.md"
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
if [ "$CHAIN_ONLY" = 1 ]; then
  step gpu_chain 200 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_gdn_chain_gpu.py
  step gdn_chain 200 python3 bench/gdn.py --chain
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
if [ "$CP_ONLY" = 1 ]; then
  step gpu_cp 200 python3 -m pytest -q -p no:cacheprovider -rfs -s tests/gpu/test_cp_gpu.py
  step cp 240 torchrun --nproc-per-node 2 bench/cp.py --out "$LOG/cp.md"
  step cp_pieces 240 torchrun --nproc-per-node 2 bench/cp.py --reps 5 \
    --piece-tokens 1024,4096,16384 --out "$LOG/cp_pieces.md"
  tail -n 3 "$LOG"/gpu_*.log
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
# the correctness gate, one suite per step so a slow compile cannot hide the others
step gpu_gdn 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gdn_gpu.py
step gpu_cp 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cp_gpu.py
step gpu_replay 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_launch_replay_gpu.py
step gpu_sdpa 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/*sdpa*.py \
  --ignore=tests/gpu/test_sdpa_bwd_gpu.py
step gpu_sdpa_bwd 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sdpa_bwd_gpu.py
step gpu_gemm 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm_gpu.py
step gpu_backend 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_native_backend_lowering.py
step gpu_autotune 45 python3 -m pytest -q -p no:cacheprovider \
  "tests/test_autotune.py::test_gpu_real_plans_are_timed_selected_and_replayed_by_a_second_process"
step demo 60 python3 -m cudnn_pygraph demo
if [ "$GATE_ONLY" = 1 ]; then
  tail -n 2 "$LOG"/gpu_*.log; tail -n 4 "$LOG/demo.log"
  tar czf "$OUT/session.tgz" -C "$LOG" .; exit 0
fi
step backend 50 python3 bench/backend.py --quick --out "$LOG/backend.md"
step gdn 220 python3 bench/gdn.py  # fla's cold compile is ~100 s of it
step gdn_profile 25 python3 bench/gdn.py --no-fla --profile --only "(a)"
step gdn_host 35 python3 bench/gdn.py --host --only "(a)"
step gdn_sweep 150 python3 bench/gdn.py --no-fla --sweep --only "(a)" --entries "s4"
step sdpa 100 python3 bench/sdpa_fwd.py --budget-s 80 --out "$LOG/sdpa_fwd.md"
tail -n 2 "$LOG"/gpu_*.log
tar czf "$OUT/session.tgz" -C "$LOG" .
