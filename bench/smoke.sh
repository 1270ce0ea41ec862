#!/usr/bin/env bash
# A quick end-to-end check on a GPU machine: versions, one async/sync checkpoint run, and one
# recovery per NVRx layer with a ~1B model. Results land in $OUT (or ./bench-out).
set -uo pipefail
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NVRX_EKS_CACHE=/tmp/nvrx-cache
python3 - <<'PY' | tee "$OUT/env.txt"
import torch, importlib.metadata as md, os, shutil
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())
print("nvrx", md.version("nvidia-resiliency-ext"), "transformers", md.version("transformers"))
print("gpus", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
print("cpus", os.cpu_count(), "disk free GB", shutil.disk_usage(".").free / 1e9, "shm free GB", shutil.disk_usage("/dev/shm").free / 1e9)
PY
M=${MODEL:-llama-1b}
COMMON=(--model "$M" --seq_len 2048 --batch_size 1 --device cuda --log_interval 10)
run() { local name=$1; shift; echo "=== $name"; timeout 300 python3 -m devtools.local --run_dir "runs/$name" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?"; cp "runs/$name/results.json" "$OUT/$name.json" 2>/dev/null; python3 -m trainer.accounting.events merge "runs/$name/events" --out "$OUT/$name.events.jsonl" >/dev/null 2>&1; tail -3 "$OUT/$name.log"; }
run async --mode baseline -- "${COMMON[@]}" --max_steps 40 --checkpoint_interval 20 --use_async_checkpoint true
run inprocess --mode inprocess -- "${COMMON[@]}" --max_steps 60 --checkpoint_interval 20 --fault_count 2 --fault_seed 3 --fault_after_step 25 --fault_types exception,hang --soft_timeout 10 --hard_timeout 30 --nccl_timeout 20
run ft --mode ft_launcher --heartbeat_timeout 20 -- "${COMMON[@]}" --max_steps 50 --checkpoint_interval 20 --fault_count 1 --fault_seed 3 --fault_after_step 25 --fault_types sigkill
