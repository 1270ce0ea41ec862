"""How long a failed worker's exit takes with its snapshot slots registered with CUDA.

A child maps N slot files in /dev/shm (first-touched), optionally registers them with CUDA,
holds some device memory, then exits with os._exit (as trainer.cli.exit_now does). The parent
times from the child's last stamp to waitpid's return: the kernel and driver teardown that the
launcher waits for before it sees the failure."""
import json, os, sys, time, subprocess

def child(mode, nfiles, gib, dev_gib):
    import torch
    torch.cuda.set_device(0)
    dev = torch.empty(int(dev_gib * 2**30), dtype=torch.uint8, device="cuda")
    bufs = []
    t0 = time.time()
    for i in range(nfiles):
        p = f"/dev/shm/exitcost.{i}.buf"
        fresh = not os.path.exists(p)
        t = torch.from_file(p, shared=True, size=int(gib * 2**30), dtype=torch.uint8)
        if fresh:
            t.fill_(1)
        bufs.append(t)
    t1 = time.time()
    if mode != "noreg":
        for t in bufs:
            rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel(), 0)
            assert int(rc) == 0, rc
    torch.cuda.synchronize()
    t2 = time.time()
    if mode == "unreg":
        for t in bufs:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
    t3 = time.time()
    print(json.dumps({"touch_s": t1 - t0, "register_s": t2 - t1, "unregister_s": t3 - t2, "exit_t": time.time()}), flush=True)
    os._exit(1)

if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    out = []
    for mode in ("noreg", "reg", "unreg", "reg"):
        for nfiles, gib in ((3, 7.4 / 1.0737),):
            p = subprocess.Popen([sys.executable, __file__, "child", mode, str(nfiles), str(gib), "30"], stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline()
            p.wait()
            done = time.time()
            rec = json.loads(line)
            rec.update(mode=mode, slots=nfiles, slot_gb=round(gib * 1.0737, 1), exit_to_reaped_s=done - rec.pop("exit_t"))
            print(json.dumps(rec), flush=True)
            out.append(rec)
    for i in range(3):
        try: os.unlink(f"/dev/shm/exitcost.{i}.buf")
        except FileNotFoundError: pass
