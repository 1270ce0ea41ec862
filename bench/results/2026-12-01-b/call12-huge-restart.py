"""A restart's registration: process A first-touches three 7.4 GB slot files and exits; process
B maps the same files and registers them (as a restarted worker does), on /dev/shm and on a
tmpfs mounted huge=always. Then B's exit time with them registered."""
import json, os, subprocess, sys, time

def touch(root):
    import torch
    for i in range(3):
        torch.from_file(f"{root}/slot{i}.buf", shared=True, size=int(7.4e9), dtype=torch.uint8).fill_(1)

def register(root):
    import torch
    torch.cuda.set_device(0)
    torch.empty(1, device="cuda")
    t0 = time.time()
    bufs = [torch.from_file(f"{root}/slot{i}.buf", shared=True, size=int(7.4e9), dtype=torch.uint8) for i in range(3)]
    t1 = time.time()
    for t in bufs:
        assert int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel(), 0)) == 0
    t2 = time.time()
    print(json.dumps({"map_s": t1 - t0, "register_s": t2 - t1, "exit_t": time.time()}), flush=True)
    os._exit(0)

if __name__ == "__main__":
    if len(sys.argv) > 2:
        {"touch": touch, "register": register}[sys.argv[1]](sys.argv[2]); sys.exit(0)
    os.makedirs("/mnt/hugeshm", exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "huge=always,size=40g", "tmpfs", "/mnt/hugeshm"], check=True)
    os.makedirs("/dev/shm/restartprobe", exist_ok=True)
    for root in ("/dev/shm/restartprobe", "/mnt/hugeshm", "/dev/shm/restartprobe", "/mnt/hugeshm"):
        t0 = time.time()
        subprocess.run([sys.executable, __file__, "touch", root], check=True)
        touch_s = time.time() - t0
        p = subprocess.Popen([sys.executable, __file__, "register", root], stdout=subprocess.PIPE, text=True)
        rec = json.loads(p.stdout.readline()); p.wait()
        rec["exit_to_reaped_s"] = time.time() - rec.pop("exit_t")
        rec.update(root=root, touch_process_s=touch_s)
        print(json.dumps(rec), flush=True)
        for i in range(3):
            os.unlink(f"{root}/slot{i}.buf")
    subprocess.run(["umount", "/mnt/hugeshm"])
