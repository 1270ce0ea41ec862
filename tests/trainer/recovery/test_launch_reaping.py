"""The node's launcher process (`trainer.recovery.launch.supervise`, PID 1 in the pods) adopts and collects
the orphans of the processes under it, and still returns the launcher's own exit code."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# The "launcher": starts a process that starts a grandchild and exits at once, orphaning it.
# The grandchild records its parent and exits; the launcher then looks for zombies among the
# children of its own parent (supervise) and exits 3.
ORPHAN = "import os, sys, time; time.sleep(0.3); open(sys.argv[1], 'w').write(str(os.getppid()))"
MIDDLE = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]])"
LAUNCHER = f"""
import os, subprocess, sys, time
out = sys.argv[1]
subprocess.run([sys.executable, "-c", {MIDDLE!r}, {ORPHAN!r}, out + ".orphan-parent"])
deadline = time.time() + 30
while not os.path.exists(out + ".orphan-parent") and time.time() < deadline:
    time.sleep(0.05)
time.sleep(1.0)  # the orphan has exited: supervise polls every 0.2 s
zombies = 0
for d in os.listdir("/proc"):
    try:
        fields = open(f"/proc/{{d}}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        continue
    zombies += fields[0] == "Z" and int(fields[1]) == os.getppid()
open(out + ".zombies", "w").write(str(zombies))
sys.exit(3)
"""


def test_orphans_under_the_launcher_are_adopted_and_collected_and_its_exit_code_kept(tmp_path):
    out = tmp_path / "probe"
    code = ("import os, sys; from trainer.recovery.launch import supervise; "
            "print('supervise', os.getpid(), flush=True); "
            f"sys.exit(supervise([sys.executable, '-c', {LAUNCHER!r}, {str(out)!r}], dict(os.environ)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    supervisor = int(proc.stdout.split()[1])
    assert proc.returncode == 3, proc.stderr
    assert int(Path(f"{out}.orphan-parent").read_text()) == supervisor  # adopted, not init's
    assert Path(f"{out}.zombies").read_text() == "0"  # and collected


def test_a_failed_launcher_exit_is_recorded_in_the_nodes_event_log(tmp_path):
    """In a pod, the Job restarts the pod after this exit: the record is its evidence."""
    from config.contract import EVENTS_DIR_ENV, NODE_RANK_ENV
    from trainer.accounting.events import read_events

    env = {EVENTS_DIR_ENV: str(tmp_path / "events"), NODE_RANK_ENV: "3"}
    for code in (0, 2, 5):
        prog = ("import os, sys; from trainer.recovery.launch import supervise; "
                f"sys.exit(supervise([sys.executable, '-c', 'raise SystemExit({code})'], "
                f"{{**os.environ, **{env!r}}}))")
        proc = subprocess.run([sys.executable, "-c", prog], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == code, proc.stderr
    (e,) = read_events(tmp_path / "events")  # neither success nor a final error (2) restarts
    assert (e["event"], e["exit_code"], e["node"], e["rank"]) == ("worker_failed", 5, 3, -1)
    assert (tmp_path / "events" / "node-00003.jsonl").is_file()
