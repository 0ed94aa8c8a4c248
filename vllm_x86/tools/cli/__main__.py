"""`python -m vllm_x86.tools.cli`: the `vllm-x86` command."""

import sys

from vllm_x86.tools.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
