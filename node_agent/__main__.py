"""``python -m node_agent``: the same as ``gpu-autoscaler-agent``."""

import sys

from node_agent.cli import main

sys.exit(main())
