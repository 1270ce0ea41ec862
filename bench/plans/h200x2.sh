#!/usr/bin/env bash
# The two-H200 runs (device kind nvidia-h200-x2), one invocation per device command of at most
# 10 minutes: `bash bench/plans/h200x2.sh CALL` with CALL one of the names below. Each writes
# its JSON and logs to $OUT (bench/gpu.sh), to be moved under bench/results/h200x2-<what>/.
#   rows         the recovery rows side by side: one exception and one hang per layer
#                (ft_launcher, in-process), snapshots of every step staged on the host, split
#                and on the device against no checkpoints, the node-tier read, the async
#                checkpoint's blocking against the device-to-host floor
#   seed42       the 5-fault seed-42 schedule in all four modes, deterministic, beside their
#                fault-free runs (every mode must end with the fault-free param_sha256)
#   published-M  the published experiment at its own shape for mode M (baseline, inprocess,
#                ft_launcher, ft_launcher-inprocess): 2,000 steps, a checkpoint every 500,
#                the seed-42 schedule; one mode per command
#   spares       two one-GPU simulated nodes, one of them a spare; a node lost, the takeover
#                timed (needs `devtools.local --spare_nodes`)
set -uo pipefail
call=${1:?usage: bench/plans/h200x2.sh rows|seed42|published-MODE|spares}
export BENCH_SECONDS=${BENCH_SECONDS:-570}  # inside the device's 10-minute command limit
here=$(dirname "$0")/..
case "$call" in
  rows)
    BENCH_ARGS="--recovery_steps 60 --modes ft_launcher,inprocess" "$here/gpu.sh" floors recovery
    BENCH_ARGS="--intervals 100" "$here/gpu.sh" tiers
    BENCH_ARGS="--throughput_runs eager,compiled-snapshots --snapshot_staging host,split,device" \
      "$here/gpu.sh" throughput ;;
  seed42)
    BENCH_ARGS="--deterministic --recovery_steps 160" "$here/gpu.sh" faultfree recovery ;;
  published-*)
    mode=${call#published-}; mode=${mode/launcher-inprocess/launcher+inprocess}
    BENCH_ARGS="--deterministic --recovery_steps 2000 --modes $mode --run_timeout 560" \
      "$here/gpu.sh" recovery ;;
  spares)
    mkdir -p "${OUT:-bench/results}"
    timeout 540 python3 -m devtools.local --mode ft_launcher+inprocess --nnodes 2 --spare_nodes 1 \
      --nproc_per_node 1 --run_dir runs/spares -- --model llama-1b --seq_len 2048 --batch_size 1 \
      --device cuda --max_steps 120 --checkpoint_interval 40 --tiers memory,node,peer --snapshot_interval 1 \
      --fault_count 1 --fault_seed 42 --fault_types node --fault_after_step 30 \
      > "${OUT:-bench/results}/spares.log" 2>&1
    cp runs/spares/results.json "${OUT:-bench/results}/spares.json"
    python3 -m bench.scrub "${OUT:-bench/results}/spares.json" ;;
  *) echo "bench/plans/h200x2.sh: unknown run $call: rows, seed42, published-MODE or spares" >&2; exit 2 ;;
esac
