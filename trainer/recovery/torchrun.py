"""torchrun as a node's agent (`forkserver.start_agent`): it names itself to its workers, holds
the stop signal blocked for them (`termination.hold_in_agent`), and forks them from a process
that has imported the trainer, as ft_launcher's agent does (`trainer.recovery.forkserver`).

    python -m trainer.recovery.torchrun <torchrun flags> --run-path --start-method=forkserver \\
        <trainer/__main__.py> <trainer flags>
"""

from trainer.recovery.forkserver import start_agent

if __name__ == "__main__":
    start_agent()
    from torch.distributed.run import main

    main()
