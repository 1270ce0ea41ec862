"""torchrun, in a process that names itself to its workers (`lifetime.announce_agent`), so each
command-line worker dies with it (`lifetime.worker_dies_with_agent`), and that holds the stop
signal blocked for them (`termination.hold_in_agent`).

    python -m trainer.recovery.torchrun <torchrun flags> -m trainer <trainer flags>
"""

import os

from trainer.faults.node_loss import NODE_LEADER_ENV
from trainer.lifetime import announce_agent
from trainer.termination import hold_in_agent

if __name__ == "__main__":
    announce_agent()
    hold_in_agent()
    os.environ.setdefault(NODE_LEADER_ENV, str(os.getpid()))  # a `node` fault takes the node
    from torch.distributed.run import main

    main()
