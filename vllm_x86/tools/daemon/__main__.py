"""`python -m vllm_x86.tools.daemon`: the daemon process (started by `vllm-x86 daemon start`)."""

import sys

from vllm_x86.tools.daemon.server import main

sys.exit(main())
