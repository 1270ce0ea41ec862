#!/usr/bin/env bash
# Run benchmark parts on a GPU machine with no network: NVRx (and what it needs) come as wheels
# in .whl/ (see BENCHMARKS.md); results go to $OUT (default bench/results).
set -uo pipefail
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
# NVLink multicast stays off on shared hosts; unbuffered output for live logs.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NVRX_EKS_CACHE=${NVRX_EKS_CACHE:-/tmp/nvrx-cache}
for part in "$@"; do
  python3 -m bench.run "$part" --out "$OUT" || echo "bench part $part failed"
done
ls -la "$OUT"
