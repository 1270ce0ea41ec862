import sys

# The guard matters for forked workers: they run this file by path, and a process they spawn
# (a replacement checkpoint writer) re-imports it as `__mp_main__`.
if __name__ == "__main__":
    from trainer import termination
    from trainer.recovery.forkserver import forked_worker
    from trainer.lifetime import leave, worker_dies_with_agent

    termination.install()  # the launcher's stop signal, held until now
    if not forked_worker():  # a forked worker died with its fork server from its first instant
        worker_dies_with_agent()
    from trainer.cli import main

    rc = main()
    if forked_worker():  # multiprocessing ends the process once every worker has returned
        if rc:
            sys.exit(rc)
    else:
        # Leave without interpreter teardown: by now results are written, the process group
        # is destroyed and the checkpoint writer stopped; what is left are library threads
        # (gloo, stores) whose C++ destructors can abort at exit, which a launcher would count
        # as a failed rank.
        leave(rc)
