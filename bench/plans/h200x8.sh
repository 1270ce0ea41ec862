#!/usr/bin/env bash
# The eight-H200 runs (device kind nvidia-h200-x8, one p5.48xlarge's worth of GPUs), one
# invocation per device command of at most 10 minutes: `bash bench/plans/h200x8.sh CALL`.
# Each writes its JSON and logs to $OUT (bench/gpu.sh), to be moved under
# bench/results/h200x8-<what>/.
#   throughput   llama3.1-8b at seq 8,192, compiled, selective activation checkpointing, 8 ranks:
#                no checkpoints, one async checkpoint, and snapshots of every step to the
#                memory and node tiers staged on the device; then the device-to-host floor
#   recovery-M   the 5-fault seed-42 schedule with llama3.1-8b at 8 ranks in mode M
#                (ft_launcher-inprocess or ft_launcher), one mode per command
#   spares       three simulated nodes of two GPUs and one spare node; a node lost, the
#                takeover from the peer tier timed
set -uo pipefail
call=${1:?usage: bench/plans/h200x8.sh throughput|recovery-MODE|spares}
export BENCH_SECONDS=${BENCH_SECONDS:-570}  # inside the device's 10-minute command limit
here=$(dirname "$0")/..
EIGHT_B="--model llama3.1-8b --nproc 8 --seq_len 8192 --batch_size 1 --activation_checkpointing selective"
case "$call" in
  throughput)
    BENCH_ARGS="$EIGHT_B --throughput_steps 30 --tiers none --throughput_runs compiled,compiled-ft" \
      "$here/gpu.sh" throughput
    BENCH_ARGS="$EIGHT_B --throughput_steps 30 --tiers memory,node --snapshot_staging device --throughput_runs compiled-snapshots" \
      "$here/gpu.sh" throughput
    BENCH_ARGS="--nproc 8" "$here/gpu.sh" floors ;;
  recovery-*)
    mode=${call#recovery-}; mode=${mode/launcher-inprocess/launcher+inprocess}
    BENCH_ARGS="$EIGHT_B --recovery_steps 120 --modes $mode --run_timeout 560" "$here/gpu.sh" recovery ;;
  spares)
    mkdir -p "${OUT:-bench/results}"
    timeout 540 python3 -m devtools.local --mode ft_launcher+inprocess --nnodes 3 --spare_nodes 1 \
      --nproc_per_node 2 --run_dir runs/spares -- --model llama-1b --seq_len 2048 --batch_size 1 \
      --device cuda --max_steps 120 --checkpoint_interval 40 --tiers memory,node,peer \
      --snapshot_interval 1 --fault_count 1 --fault_seed 42 --fault_types node --fault_after_step 30 \
      > "${OUT:-bench/results}/spares.log" 2>&1
    cp runs/spares/results.json "${OUT:-bench/results}/spares.json"
    python3 -m bench.scrub "${OUT:-bench/results}/spares.json" ;;
  *) echo "bench/plans/h200x8.sh: unknown run $call: throughput, recovery-MODE or spares" >&2; exit 2 ;;
esac
