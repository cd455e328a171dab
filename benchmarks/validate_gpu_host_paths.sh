#!/usr/bin/env bash
# The host paths on a GPU machine (issue 32 item 8): calibrate a real-shaped Mixtral-8x7B layer
# stack (2 layers, random weights), then compare the simulator with the real executor for
# copies from pageable memory (accelerate) and experts computed on the host's cores (cpu-moe,
# fiddler), with lru (pinned copies) beside them. Run from the repository root on a machine with
# a CUDA GPU, the package and its tracer extra:
#   bash benchmarks/validate_gpu_host_paths.sh OUTDIR [THREADS]
# Writes OUTDIR/machine.txt, pytest.txt (the executor's CUDA tests), calibrate.txt, profile.yaml
# and validate.md (benchmarks/validate_cpu.py's tables). SIMCTL overrides the simctl command,
# DEVICE and MODEL the device and the model (a smaller shape for a dry run).
# What the figures mean: docs/calibration.md, "Measured on an H200".
set -uo pipefail
OUT=${1:?usage: $0 OUTDIR [THREADS]}
THREADS=${2:-8}
SIMCTL=${SIMCTL:-simctl}
DEVICE=${DEVICE:-cuda}   # cpu: a dry run of the script (with a small MODEL)
MODEL=${MODEL:-'{base: mixtral-8x7b, num_layers: 2}'}
S=scenarios/validate-h200-host-paths.yaml
mkdir -p "$OUT"
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,memory.total --format=csv
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|L3 cache)'
  echo "bf16 flags: $(grep -o -w -E 'avx512_bf16|amx_bf16|amx_tile|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  grep -E 'MemTotal' /proc/meminfo
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_executor_cuda.py tests/test_executor_host_paths.py \
  2>&1 | tee "$OUT/pytest.txt"
# the scenario's trace as a file, for the calibration's executor-step runs (its last 2 requests)
$SIMCTL trace synth -o "$OUT/trace.parquet" --preset mixtral-8x7b --requests 4 --prompt-len 16 --decode-len 8 \
  --seed 0 --set num_layers=2 >/dev/null
# --context 20: the mean decode position of those requests (16 prompt tokens, 8 decoded)
timeout 300 $SIMCTL calibrate --device "$DEVICE" --model "$MODEL" --trace "$OUT/trace.parquet" \
  --context 20 --threads "$THREADS" --out "$OUT/profile.yaml" 2>&1 | tee "$OUT/calibrate.txt"
rm -f "$OUT/trace.parquet"
[ -s "$OUT/profile.yaml" ] || { echo "no profile: calibration failed"; exit 1; }
{
  timeout 200 python3 benchmarks/validate_cpu.py --device "$DEVICE" --model "$MODEL" --scenario "$S" --use-profile "$OUT/profile.yaml" \
    --policies cpu-moe fiddler --rates 0.25 0.5 --repeats 2
  echo
  timeout 150 python3 benchmarks/validate_cpu.py --device "$DEVICE" --model "$MODEL" --scenario "$S" --use-profile "$OUT/profile.yaml" \
    --policies accelerate lru --rates 0.5 --repeats 2 --policy-params '{accelerate: {stream_non_expert: false}}'
} 2>&1 | tee "$OUT/validate.md"
