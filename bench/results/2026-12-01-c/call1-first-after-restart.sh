# Diagnostic only: profile the first step after an in-process restart, a steady step, and the
# first step of a relaunched worker (ft_launcher), one rank of llama-1b on one GPU.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NVRX_EKS_CACHE=/tmp/nvrx-cache
mkdir -p /mnt/hugeshm && mount -t tmpfs -o huge=always,size=60g tmpfs /mnt/hugeshm
R=$OUT; c="--model llama-1b --seq_len 2048 --batch_size 1 --device cuda --log_interval 1 --final_checkpoint false --checkpoint_interval 0 --tiers memory,node --snapshot_interval 1 --max_steps 24 --fault_count 1 --fault_seed 42 --fault_types exception --fault_after_step 10 --soft_timeout 5 --hard_timeout 30 --nccl_timeout 20 --deterministic true --profile_steps 1"
run() { name=$1; mode=$2; shift 2; timeout 150 python3 -m trainer.local --mode $mode --nproc_per_node 1 --run_dir /tmp/r$name -- $c --node_dir /mnt/hugeshm/$name "$@" > $R/$name.log 2>&1; cp /tmp/r$name/events.jsonl $R/$name.events.jsonl; python3 .whl/diag/gaps.py /tmp/r$name > $R/$name.gaps.txt 2>&1; rm -rf /mnt/hugeshm/$name; }
run A inprocess --profile_from 21
run B inprocess --profile_from 23
run C ft_launcher --profile_from 21
cd /tmp && tar czf $OUT/traces.tar.gz $(find /tmp/rA /tmp/rB /tmp/rC -name 'rank*.trace.json' -size -200M) 2>/dev/null; ls -la $OUT
