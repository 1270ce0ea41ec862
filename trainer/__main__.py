import os
import sys

from trainer.cli import main
from trainer.recovery.forkserver import forked_worker

# The guard matters for forked workers: they run this file by path, and a process they spawn
# (the checkpoint writer) re-imports it as `__mp_main__`.
if __name__ == "__main__":
    rc = main()
    if forked_worker():  # multiprocessing ends the process once every worker has returned
        if rc:
            sys.exit(rc)
    else:
        # Leave without interpreter teardown: by now results are written, the process group
        # is destroyed and the checkpoint writer stopped; what is left are library threads
        # (gloo, stores) whose C++ destructors can abort at exit, which a launcher would count
        # as a failed rank.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
