#!/usr/bin/env bash
# Run benchmark parts (`python -m bench.run PART`, with $BENCH_ARGS) on a GPU machine, which may
# have no network: NVRx (and what it needs) can come as wheels in .whl/ (see BENCHMARKS.md).
# Results go to $OUT (default bench/results), every run's log and event log into $OUT/logs.tar.gz.
# BENCH_SECONDS bounds the parts together, so the logs are packed even when time runs out.
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
# The node tier on 2 MiB pages, as the GPU nodes' /dev/shm has them: a tmpfs mounted huge=always
# (as root), unless BENCH_ARGS names a --node_dir or NODE_PAGES=base asks for the host's own.
# Every result records the node directory's page size (machine.node_dir_page_kib).
if [[ "${BENCH_ARGS:-}" != *--node_dir* && "${NODE_PAGES:-huge}" == huge ]]; then
  mkdir -p /mnt/hugeshm
  if mountpoint -q /mnt/hugeshm || mount -t tmpfs -o huge=always,size=100g nvrx-huge /mnt/hugeshm; then
    BENCH_ARGS="${BENCH_ARGS:-} --node_dir /mnt/hugeshm"
  else
    echo "bench/gpu.sh: could not mount a huge-page tmpfs at /mnt/hugeshm: the node tier stays on the host's pages"
  fi
fi
# Logs are packed after each part and once more on the way out. Under an outer time limit (a CI
# job's, a scheduler's), keep BENCH_SECONDS some 30 s below it: a shell killed outright leaves
# only what was packed by then.
deadline=$(( $(date +%s) + ${BENCH_SECONDS:-100000} ))
export BENCH_SINCE=${BENCH_SINCE:-$(date +%s)}  # logs older than this invocation are not packed
trap 'python3 -m bench.run bundle --out "$OUT"' EXIT
for part in "$@"; do
  left=$(( deadline - $(date +%s) ))
  [ "$left" -gt 10 ] || { echo "no time left for $part"; continue; }
  timeout -s TERM "$left" python3 -m bench.run "$part" --out "$OUT" ${BENCH_ARGS:-} || echo "bench part $part stopped"
  python3 -m bench.run bundle --out "$OUT"
done
ls -la "$OUT"
