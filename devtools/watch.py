"""`python -m devtools.watch RUN_DIR`: the live view of a local run (`devtools.local`), from its
event log, refreshed until it ends; the same view as `nvrx-eks watch` on the cluster
(`trainer.telemetry.status`)."""

from __future__ import annotations

import sys

from trainer.telemetry.status import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m devtools.watch"))
