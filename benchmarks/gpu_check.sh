#!/usr/bin/env bash
# The CUDA paths, for a machine with an NVIDIA GPU, in parts that each fit in a few minutes:
#   setup:   device state through NVML, the clock script's status (lock/unlock as dry runs only: nothing is
#            changed), the runtimes that run there, and the fast tests with the GPU present;
#   offline: the offline computation in float32 (deit_base batch 4) and float16 (batch 64), and a dense
#            recorded trace of the float16 workload replayed through the offline computation;
#   bench:   the side-by-side benchmark at 224 and 448 px with pomt, top-k and ToMe, pomt's chunked attention
#            against its chunk budget, and the float32 schedule against FLOP-matched top-k and ToMe (needs the
#            offline part's schedule in OUT/bin);
#   repro:   the float32 offline computation three times in a row (benchmarks/reproducibility.py): same answer?
#   frontier: the frontier search on the digits case with deit_base at 224 px, batch 64, float16 (issue 30,
#            item 10; the model trains on the GPU first), then its schedule against top-k and ToMe tuned to its
#            measured latency (benchmark.py --schedule, the default latency match);
#   graphs:  the CUDA graph runtime through pomt: its tests on the GPU, the offline computation measured and
#            verified as graphs (deit_base, batch 64, float16), its schedule applied and served from a graph
#            (benchmarks/serve_graph.py);
#   graph-bench: the side-by-side benchmark (pomt, top-k, ToMe at batch 64, float16) eager, then as graphs;
#   predict: the latency model against the patched model for multi-block schedules of every reducer
#            (benchmarks/prediction_error.py --part multi, deit_base at batch 64, float16);
#   accuracy: the accuracy step on the GPUs (benchmarks/accuracy_spread.py): one rank per GPU (NCCL where there
#            are two or more) against one process, images held against read again, a warm cache's second run;
# Everything it prints also goes to OUT/gpu_log_PART.txt; results land in OUT/bin.
# One 10-minute slot, as run on an H200 on 2026-11-30 (6 min 13 s): TESTS=0 setup, graphs, BACKEND=cudagraph
# FRONTIER_S=300 BENCH_S=0 frontier, graph-bench. Not yet run on a GPU: BACKEND=cudagraph predict (the latency
# model with the reducers' costs measured as graphs, e0e713e), and graphs since that commit.
# Usage: bash benchmarks/gpu_check.sh [OUT] [setup|offline|bench|repro|frontier|graphs|graph-bench|predict|accuracy|all]
#        (default OUT: bin/gpu_check, part: all; PYTHON overrides the interpreter; TESTS=0 leaves out setup's
#        tests, which hide the GPU and so check the suite, not the CUDA paths; BACKEND=cudagraph runs the frontier
#        part's search, verification and benchmark, and the predict part's curve, costs and schedules, as CUDA
#        graphs)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(realpath -m "${1:-$ROOT/bin/gpu_check}")
PART=${2:-all}
cd "$ROOT" || exit 2
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p "$OUT/bin"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/gpu_log_$PART.txt") 2>&1

step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }

setup() {
  step environment
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,persistence_mode \
    --format=csv
  "$PYTHON" -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__, 'cuda', torch.cuda.is_available())"
  step "pomt device (NVML)"
  "$PYTHON" -m pomt device --device cuda --json
  step "clock script (status; lock and unlock as dry runs)"
  bash scripts/lock_clocks.sh status
  bash scripts/lock_clocks.sh --dry-run lock
  bash scripts/lock_clocks.sh --dry-run unlock
  step backends
  "$PYTHON" -m pomt backend --device cuda
  "$PYTHON" -m pomt backend tensorrt --device cuda
  [ "${TESTS:-1}" = 0 ] && return
  step "fast tests with the GPU present"
  timeout 240 "$PYTHON" -m pytest -q -p no:cacheprovider -m "not slow"
}

offline() {
  step "offline: deit_base batch 4, float32"
  timeout 200 "$PYTHON" offline_computation.py --model deit_base --batch-size 4 --device cuda --output-dir "$OUT/bin" \
    --no-progress
  step "offline: deit_base batch 64, float16"
  timeout 200 "$PYTHON" offline_computation.py --model deit_base --batch-size 64 --device cuda --dtype float16 \
    --output-dir "$OUT/bin" --no-progress
  step "record: deit_base batch 64, float16, every count in 6 shuffled passes"
  timeout 200 "$PYTHON" -m pomt record --model deit_base --batch-size 64 --device cuda --dtype float16 --passes 6 \
    --output-dir "$OUT/bin" --no-progress
  step "offline on the recorded trace (replay)"
  trace=$(find "$OUT/bin" -maxdepth 1 -name "*.record.csv" | head -1)
  [ -n "$trace" ] && timeout 120 "$PYTHON" offline_computation.py --replay "$trace" --output-dir "$OUT/bin/replay" \
    --no-progress
}

bench() {
  step "benchmark: 224 px, batch 64"
  timeout 200 "$PYTHON" benchmark.py --model deit_base --batch-size 64 --device cuda --methods none,pomt,topk,tome \
    --remove 98 --r 8 --rounds 20 --power-seconds 1 --output-dir "$OUT/bin"
  step "benchmark: 448 px, batch 16"
  timeout 200 "$PYTHON" benchmark.py --model deit_base --batch-size 16 --input-size 448 --device cuda \
    --methods none,pomt,topk,tome --remove 392 --r 32 --rounds 20 --power-seconds 1 --output-dir "$OUT/bin"
  step "pomt's chunked attention: speed and peak memory against the chunk budget (448 px, batch 16)"
  timeout 120 "$PYTHON" benchmarks/attention_chunks.py --device cuda --budgets-mb 16 64 0
  step "benchmark: the float32 schedule against top-k and ToMe tuned to its measured latency"
  timeout 200 "$PYTHON" benchmark.py --schedule "$OUT/bin/deit_base_patch16_224_cuda_bs4_is224.schedule.json" \
    --device cuda --methods none,topk,tome --rounds 20 --power-seconds 1 --output-dir "$OUT/bin"
  step "benchmark: the float32 schedule against FLOP-matched top-k and ToMe"
  timeout 150 "$PYTHON" benchmark.py --schedule "$OUT/bin/deit_base_patch16_224_cuda_bs4_is224.schedule.json" \
    --device cuda --methods none,topk,tome --match flops --rounds 20 --power-seconds 1 --output-dir "$OUT/bin"
}

repro() {
  step "reproducibility: deit_base batch 4, float32, three offline runs"
  timeout 540 "$PYTHON" benchmarks/reproducibility.py --runs 3 --model deit_base --batch-size 4 --keep "$OUT/bin/repro" \
    -- --device cuda
}

frontier() {
  step "frontier: digits case, deit_base 224 px, batch 64, float16, ${BACKEND:-eager} (trained here first)"
  timeout "${FRONTIER_S:-330}" "$PYTHON" benchmarks/frontier.py --device cuda --dtype float16 --model deit_base \
    --backend "${BACKEND:-eager}" --input-size 224 --lr "${FRONTIER_LR:-1e-4}" --batch-sizes 64 --output-dir "$OUT/bin/frontier"
  schedule=$(find "$OUT/bin/frontier/bs64" -maxdepth 1 -name "*.schedule.json" | head -1)
  checkpoint=$(find bin/cache -maxdepth 1 -name "digits_deit_base_patch16_224_*.pth" | head -1)
  data=$(find bin/cache -maxdepth 2 -type d -name calibration -path "*digits_224px_*" | head -1)
  if [ -z "$schedule" ] || ! "$PYTHON" -c "import json, sys; sys.exit(not json.load(open(sys.argv[1]))['prune'])" \
    "$schedule"; then
    echo "the frontier shipped no schedule: nothing to benchmark"; return
  fi
  step "serve: the frontier's schedule"
  timeout 90 "$PYTHON" benchmarks/serve_graph.py "$schedule"
  [ "${BENCH_S:-150}" = 0 ] && return
  step "benchmark: the frontier's schedule against top-k and ToMe tuned to its measured latency, with accuracy"
  timeout "${BENCH_S:-150}" "$PYTHON" benchmark.py --schedule "$schedule" --device cuda --methods none,topk,tome \
    --checkpoint "$checkpoint" --dataset-root "$data" --accuracy-samples 808 --rounds 10 --power-seconds 1 \
    --output-dir "$OUT/bin/frontier"
}

graphs() {
  step "backend: cudagraph"
  "$PYTHON" -m pomt backend cudagraph --device cuda
  step "tests of the CUDA graph runtime on the GPU"
  POMT_TESTS_GPU=1 timeout 120 "$PYTHON" -m pytest -q -p no:cacheprovider tests/runtimes/test_cudagraph_gpu.py
  step "offline: deit_base batch 64, float16, measured and verified as CUDA graphs"
  timeout "${GRAPHS_S:-150}" "$PYTHON" offline_computation.py --model deit_base --batch-size 64 --device cuda \
    --dtype float16 --backend cudagraph --output-dir "$OUT/bin/graphs" --no-progress
  schedule=$(find "$OUT/bin/graphs" -maxdepth 1 -name "*.schedule.json" | head -1)
  if [ -n "$schedule" ]; then
    step "serve: the offline computation's schedule"
    timeout 90 "$PYTHON" benchmarks/serve_graph.py "$schedule"
  fi
}

graph_bench() {
  for backend in eager cudagraph; do
    step "benchmark: 224 px, batch 64, float16, $backend"
    timeout 90 "$PYTHON" benchmark.py --model deit_base --batch-size 64 --device cuda --dtype float16 \
      --backend "$backend" --methods none,pomt,topk,tome --remove 98 --r 8 --rounds 15 --power-seconds 0 \
      --no-profile --output-dir "$OUT/bin/graphs/bench_$backend"
  done
}

predict() {
  step "prediction error: multi-block schedules, deit_base batch 64, float16, ${BACKEND:-eager}"
  timeout 150 "$PYTHON" benchmarks/prediction_error.py --part multi --device cuda --dtype float16 \
    --backend "${BACKEND:-eager}" --workloads deit_base:64:224 --rounds 30 --curve-points 16
}

accuracy() {
  local gpus
  gpus=$(nvidia-smi -L | grep -c "^GPU")
  step "accuracy counted by $gpus GPU rank(s) against one process"
  "$PYTHON" benchmarks/accuracy_spread.py --part ranks --device cuda --nproc "$gpus" --output-dir "$OUT/bin/accuracy-spread"
  step "accuracy with the decoded images held against read again, on the GPU"
  "$PYTHON" benchmarks/accuracy_spread.py --part held --device cuda --output-dir "$OUT/bin/accuracy-spread"
  step "two frontier runs sharing one accuracy cache, on the GPU"
  "$PYTHON" benchmarks/accuracy_spread.py --part cache --device cuda --output-dir "$OUT/bin/accuracy-spread"
}

case "$PART" in
  setup) setup ;;
  offline) offline ;;
  bench) bench ;;
  repro) repro ;;
  frontier) frontier ;;
  graphs) graphs ;;
  graph-bench) graph_bench ;;
  predict) predict ;;
  accuracy) accuracy ;;
  all) setup; offline; bench; repro; frontier; graphs; graph_bench; predict; accuracy ;;
  *) echo "gpu_check.sh: unknown part '$PART' (setup, offline, bench, repro, frontier, graphs, graph-bench, predict,"\
       "accuracy or all)"
     exit 2 ;;
esac
ls -la "$OUT/bin"
