"""Entry point of `python -m k8s`."""

import sys

from k8s.cli import main

sys.exit(main())
