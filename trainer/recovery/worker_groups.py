"""Imported by the fork server alone (the first of `trainer.recovery.forkserver.PRELOAD`): every worker it
forks leads a process group of its own.

A launcher cleans up after its workers by signalling their process groups (NVRx 0.7 sends
SIGTERM, then SIGKILL, to the group of every worker it started). A forked worker would otherwise
share the launcher's group, and that cleanup would kill the launcher itself. The fork server
sets the child's group as well as the child, the way shells do, so the group is in place before
the launcher learns the pid.
"""

import os

_fork = os.fork


def _fork_into_own_group() -> int:
    pid = _fork()
    if pid == 0:
        os.fork = _fork  # the worker's own forks stay in its group, as they would anywhere
        os.setpgid(0, 0)
    else:
        try:
            os.setpgid(pid, pid)
        except OSError:  # the child got there first, or is gone already
            pass
    return pid


os.fork = _fork_into_own_group
