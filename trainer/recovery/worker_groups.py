"""Imported by the fork server alone (the first of `trainer.recovery.forkserver.PRELOAD`): the
fork server dies with its launcher, and every worker it forks leads a process group of its own
and dies with the fork server.

A launcher cleans up after its workers by signalling their process groups (NVRx 0.7 sends
SIGTERM, then SIGKILL, to the group of every worker it started). A forked worker would otherwise
share the launcher's group, and that cleanup would kill the launcher itself. The fork server
sets the child's group as well as the child, the way shells do, so the group is in place before
the launcher learns the pid.

Lifetimes (`trainer.lifetime`): the launcher starts the fork server from its main
thread, and the fork server forks from its only thread, so the parent-death signal is safe on
both. Set in the child right after the fork, it leaves no instant in which a killed fork server
would leave a worker behind.
"""

import os

from trainer.lifetime import agent, die_with_parent

_fork = os.fork


def _fork_into_own_group() -> int:
    server = os.getpid()
    pid = _fork()
    if pid == 0:
        os.fork = _fork  # the worker's own forks stay in its group, as they would anywhere
        os.setpgid(0, 0)
        die_with_parent(server)
    else:
        try:
            os.setpgid(pid, pid)
        except OSError:  # the child got there first, or is gone already
            pass
    return pid


os.fork = _fork_into_own_group
if agent() is not None:  # the fork server of a launcher that named itself (forkserver.main)
    die_with_parent(agent())
