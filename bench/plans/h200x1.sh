#!/usr/bin/env bash
# The one-H200 checks of paths CPU tests cover only on CPU and NVRx 0.4.1, in one device command
# of at most 10 minutes: `bash bench/plans/h200x1.sh paths`. Writes logs and JSON to $OUT.
#   paths  the GPU tests of the snapshot copies; the spares and shrink tests (CPU ranks) and the
#          launcher's shapes on the image's NVRx (0.7.x: `--nnodes N:N+K`, GROUP_RANK of a spare);
#          one GPU through four faults in ft_launcher+inprocess, its durable checkpoints
#          committed through the store by the writer process
#   nodes  the lost-node takeover on the image's NVRx (bench.node_loss, a spare and two ways to
#          lose a node; the spares tests) with CPU ranks computing in fp32, and one bf16 CPU
#          job under Python's fault handler: where that image's torch crashes in bf16 on this CPU
#   restarts one GPU rank of llama-1b through six exceptions in ft_launcher+inprocess, snapshots
#          of every step in the memory and node tiers (the node directory on 2 MiB pages): the
#          device memory each in-process attempt starts from, and what of the previous one survived
#   published the published experiment at its shape on one GPU: llama-1b, 2,000 steps, a durable
#          checkpoint every 500, the seed-42 five-fault schedule, ft_launcher+inprocess, snapshots
#          in the memory and node tiers at the auto cadence, staged through device memory; before
#          it, the same rank for 600 steps without snapshots or checkpoints (the reference)
#   cadence the auto snapshot cadence's cost at batch 1, 4 and 8 (device staging, 2 MiB pages),
#          each against the same run without snapshots; then one GPU rank through six in-process
#          restarts with few snapshots, for the throughput of each attempt
#   floor  the restart floor: one GPU rank of llama-1b through ten exceptions in ft_launcher, then
#          in ft_launcher+inprocess (MODES=... for fewer, FLOOR_ARGS=... for more trainer flags;
#          160 steps, deterministic, snapshots of every step in the memory and node tiers, the
#          node directory on 2 MiB pages): each restart's phases
#   probe  what NCCL's init and abort cost (bench.nccl_costs), pinning and exit at llama-1b's slot
#          size (bench.hugepages), then `floor` at 60 steps and four exceptions
#   writer the checkpoint writer on the image's NVRx with a GPU rank (told its requests hold
#          host memory only): a tiny-model run through two exceptions, every checkpoint committed
set -uo pipefail
call=${1:?usage: bench/plans/h200x1.sh paths|nodes|restarts|published|cadence|floor|probe|writer}
export OUT=${OUT:-bench/results}
here=$(dirname "$0")/..
mkdir -p "$OUT"
# Result files leave without this machine's paths (interpreter, temp and work directories).
trap 'compgen -G "$OUT/*.json" > /dev/null && python3 -m bench.scrub "$OUT"/*.json' EXIT
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The node tier on 2 MiB pages, as the GPU nodes' /dev/shm has them; the mount is recorded.
huge_node_dir() {
  mkdir -p /mnt/hugeshm
  mountpoint -q /mnt/hugeshm || mount -t tmpfs -o huge=always,size=80g nvrx-huge /mnt/hugeshm
  grep -h hugeshm /proc/mounts | tee "$OUT/node-dir.txt"
}
# One GPU rank of llama-1b (seq 2048, batch 1) in $MODE (default ft_launcher+inprocess), its
# node tier on /mnt/hugeshm: `one_gpu_rank LIMIT_S RUN_DIR TRAINER_FLAGS...`.
one_gpu_rank() {
  local limit=$1 run_dir=$2; shift 2
  timeout "$limit" python3 -m devtools.local --mode "${MODE:-ft_launcher+inprocess}" --nproc_per_node 1 \
    --run_dir "$run_dir" --heartbeat_timeout 60 -- --model llama-1b --seq_len 2048 \
    --batch_size 1 --device cuda --node_dir /mnt/hugeshm --soft_timeout 5 --hard_timeout 30 \
    --barrier_timeout 120 --completion_timeout 120 --nccl_timeout 20 "$@"
}
python3 -c "import torch, importlib.metadata as m; print('torch', torch.__version__, 'nvrx', m.version('nvidia-resiliency-ext'), torch.cuda.get_device_name())" | tee "$OUT/env.txt"
case "$call" in
  paths)
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/trainer/snapshots/test_snapshot_gpu.py \
      > "$OUT/gpu-tests.log" 2>&1; echo "gpu tests rc=$?"
    BENCH_SECONDS=260 BENCH_ARGS="--nproc 1 --recovery_steps 80 --modes ft_launcher+inprocess" \
      "$here/gpu.sh" recovery; echo "recovery rc=$?"
    # CPU ranks (gloo), as on every CPU machine: with the GPU visible, `--device auto` would put
    # a simulated node's ranks on the one GPU
    CUDA_VISIBLE_DEVICES= timeout 240 python3 -m pytest -q -p no:cacheprovider --basetemp /tmp/bt \
      tests/trainer/recovery/test_spares_e2e.py tests/trainer/recovery/test_launch_topology.py \
      > "$OUT/spares-tests.log" 2>&1
    echo "spares tests rc=$?"; tail -n 3 "$OUT"/*-tests.log ;;
  nodes)
    # CPU ranks (gloo) throughout: `--device auto` would put every rank on the one GPU
    export CUDA_VISIBLE_DEVICES=
    PYTHONFAULTHANDLER=1 timeout 150 python3 -m devtools.local --mode baseline --nproc_per_node 2 \
      --run_dir /tmp/bf16 --job_restarts 0 --timeout 120 -- --model tiny --max_steps 4 \
      --compute_dtype bf16 --use_async_checkpoint false --final_checkpoint false \
      > "$OUT/cpu-bf16-faulthandler.log" 2>&1; echo "bf16 cpu job rc=$?"
    timeout 300 python3 -m bench.node_loss --out /tmp/node-loss --cases spare-kill,spare-freeze \
      --compute_dtype fp32 --limit_s 140; echo "node loss rc=$?"
    NVRX_EKS_TEST_COMPUTE_DTYPE=fp32 timeout 200 python3 -m pytest -q -p no:cacheprovider \
      --basetemp /tmp/bt tests/trainer/recovery/test_spares_e2e.py \
      tests/trainer/recovery/test_launch_topology.py > "$OUT/spares-tests.log" 2>&1
    echo "spares tests rc=$?"; tail -n 3 "$OUT/spares-tests.log"
    cp /tmp/node-loss/*.json "$OUT"/
    tar -czf "$OUT/logs.tar.gz" -C /tmp --exclude='*/checkpoints' --exclude='*/nodes' \
      node-loss/runs bf16 ;;
  restarts)
    huge_node_dir
    one_gpu_rank 420 /tmp/restarts --max_steps 160 --checkpoint_interval 0 \
      --fault_count 6 --fault_seed 2027 --fault_types exception --fault_after_step 15 \
      --tiers memory,node --snapshot_interval 1 > "$OUT/restarts.log" 2>&1
    echo "restarts run rc=$?"
    cp /tmp/restarts/results.json "$OUT/restarts-results.json"
    python3 -c "import json; r = json.load(open('$OUT/restarts-results.json')); print([(f['step'], f['leftovers'], f['device_memory']) for f in r['faults']], r.get('device_memory'), r.get('param_sha256'))"
    grep -h '"leftovers"' /tmp/restarts/events/*.jsonl > "$OUT/restarts-leftovers.jsonl" ;;
  published)
    huge_node_dir
    # the reference: the same rank without snapshots or checkpoints, 400 steps, no fault
    one_gpu_rank 100 /tmp/reference --max_steps 400 --checkpoint_interval 0 \
      --final_checkpoint false > "$OUT/reference.log" 2>&1
    echo "reference run rc=$?"
    cp /tmp/reference/results.json "$OUT/reference-results.json"
    one_gpu_rank 470 /tmp/published --max_steps 2000 --checkpoint_interval 500 \
      --fault_count 5 --fault_seed 42 --fault_types exception,hang --fault_type_weights 0.6,0.4 \
      --fault_after_step 10 --tiers memory,node --snapshot_staging device \
      > "$OUT/published.log" 2>&1
    echo "published run rc=$?"
    cp /tmp/published/results.json "$OUT/published-results.json"
    grep -h "snapshots every\|warning" "$OUT/published.log" | head -5
    python3 -c "import json; r = json.load(open('$OUT/published-results.json')); print({k: r.get(k) for k in ('steps_completed', 'training_goodput_pct', 'infra_goodput_pct', 'tokens_per_second', 'snapshot_cadence', 'device_memory')}); print([(f['step'], f['type'], round(f['recovery_seconds'] or -1, 2), f['steps_lost'], f['restored_from'], f['device_memory']) for f in r['faults']])"
    python3 -c "import json; r, p = (json.load(open(f'$OUT/{n}-results.json')) for n in ('reference', 'published')); print('median step', r['step_time_seconds'], 'without snapshots,', p['step_time_seconds'], 'with; throughput', round(100 * r['loop_step_seconds'] / p['loop_step_seconds'], 1), '% of the reference (loop step with stalls)')"
    tar -czf "$OUT/events.tar.gz" -C /tmp published/events reference/events ;;
  cadence)
    huge_node_dir
    for b in 1 4 8; do
      timeout 150 python3 -m bench.run throughput --out "$OUT" --nproc 1 --batch_size $b \
        --throughput_steps 60 --throughput_runs eager,eager-snapshots --snapshot_interval auto \
        --snapshot_staging device --node_dir /mnt/hugeshm > "$OUT/cadence-b$b.log" 2>&1
      echo "batch $b rc=$?"
    done
    python3 -c "import json, glob; [print(k, v.get('throughput_vs_no_checkpoint_pct'), v.get('steady_step_seconds'), v.get('snapshot_cadence')) for f in sorted(glob.glob('$OUT/throughput-*.json')) for k, v in json.load(open(f))['results'].items()]"
    one_gpu_rank 200 /tmp/attempts --max_steps 300 --checkpoint_interval 0 \
      --fault_count 6 --fault_seed 2027 --fault_types exception --fault_after_step 15 \
      --tiers memory,node --snapshot_interval 50 > "$OUT/attempts.log" 2>&1
    echo "attempts run rc=$?"
    grep -o "step  *[0-9]*/300 .*tok/s" "$OUT/attempts.log" | awk '{print $2, $(NF-1)}' | tr '\n' ' ' ;;
  probe)
    huge_node_dir
    timeout 200 python3 -m bench.nccl_costs --dir /mnt/hugeshm --slot_gb 14.8 --repeat 2 \
      --out "$OUT" > "$OUT/nccl-costs.log" 2>&1; echo "nccl costs rc=$?"; cat "$OUT/nccl-costs.log"
    timeout 150 python3 -m bench.hugepages --dirs /mnt/hugeshm --slot_gb 14.8 --out "$OUT" \
      > "$OUT/hugepages.log" 2>&1; echo "hugepages rc=$?"; cat "$OUT/hugepages.log"
    STEPS=60 FAULTS=4 bash "$0" floor ;;
  floor)
    huge_node_dir
    runs=()
    for mode in ${MODES:-ft_launcher ft_launcher+inprocess}; do
      name=floor-${mode/+/-}; rm -rf "/tmp/$name"  # a warm machine keeps the last run
      runs+=("$name")
      MODE=$mode one_gpu_rank 270 /tmp/$name --max_steps "${STEPS:-160}" --checkpoint_interval 40 \
        --fault_count "${FAULTS:-10}" --fault_seed 7 --fault_types exception --fault_after_step 10 \
        --tiers memory,node --snapshot_interval 1 --deterministic true ${FLOOR_ARGS:-} > "$OUT/$name.log" 2>&1
      echo "$mode run rc=$?"
      cp /tmp/$name/results.json "$OUT/$name-results.json"
      python3 -m bench.tables --phases "$OUT/$name-results.json"
    done
    tar -czf "$OUT/logs.tar.gz" -C /tmp --exclude='*/checkpoints' --exclude='*/nodes' "${runs[@]}" ;;
  writer)
    timeout 300 python3 -m devtools.local --mode ft_launcher --nproc_per_node 1 --run_dir /tmp/w \
      -- --model tiny --device cuda --max_steps 40 --checkpoint_interval 10 \
      --fault_count 2 --fault_seed 1 --fault_types exception --fault_after_step 5 \
      > "$OUT/writer.log" 2>&1; echo "writer run rc=$?"
    cp /tmp/w/results.json "$OUT/writer-results.json"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> "$OUT/writer.log" 2>&1
    python3 -c "import json; r = json.load(open('$OUT/writer-results.json')); print({k: r.get(k) for k in ('steps_completed', 'restarts', 'checkpoint', 'param_sha256')})" ;;
  *) echo "bench/plans/h200x1.sh: unknown run $call: paths, nodes, restarts, published, cadence, floor, probe, writer" >&2; exit 2 ;;
esac
