"""cudaHostRegister of slot files on /dev/shm (4 KiB pages) against a tmpfs mounted huge=always."""
import json, os, subprocess, sys, time
import torch

def probe(root, n=3, gb=7.4):
    os.makedirs(root, exist_ok=True)
    torch.cuda.set_device(0)
    bufs, out = [], {"root": root}
    t0 = time.time()
    for i in range(n):
        t = torch.from_file(f"{root}/slot{i}.buf", shared=True, size=int(gb * 1e9), dtype=torch.uint8)
        t.fill_(1)
        bufs.append(t)
    out["touch_s"] = time.time() - t0
    t0 = time.time()
    for t in bufs:
        assert int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel(), 0)) == 0
    out["register_s"] = time.time() - t0
    src = torch.empty(int(gb * 1e9), dtype=torch.uint8, device="cuda")
    for _ in range(2):
        torch.cuda.synchronize(); t0 = time.time()
        bufs[0].copy_(src, non_blocking=True); torch.cuda.synchronize()
        out["d2h_GBps"] = gb / (time.time() - t0)
    t0 = time.time()
    for t in bufs:
        torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
    out["unregister_s"] = time.time() - t0
    out["meminfo"] = [l for l in open("/proc/meminfo") if "Huge" in l and "Shmem" in l]
    del bufs
    for i in range(n):
        os.unlink(f"{root}/slot{i}.buf")
    print(json.dumps(out), flush=True)

if __name__ == "__main__":
    probe("/dev/shm/hugeprobe")
    os.makedirs("/mnt/hugeshm", exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "huge=always,size=40g", "tmpfs", "/mnt/hugeshm"], capture_output=True, text=True)
    print("mount:", r.returncode, r.stderr.strip(), flush=True)
    if r.returncode == 0:
        probe("/mnt/hugeshm")
        subprocess.run(["umount", "/mnt/hugeshm"])
