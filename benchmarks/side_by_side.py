"""Contenders side by side on one model: the script form of `vllm-x86 bench`.

The harness lives in vllm_x86/bench/ (method: its docstrings and docs/benchmarks.md);
this script only runs it, with the same options:

    .venv/bin/python benchmarks/side_by_side.py                                # stock, plugin (+ llamacpp)
    .venv/bin/python benchmarks/side_by_side.py --model random:qwen3-0.6b
    .venv/bin/python benchmarks/side_by_side.py --contenders plugin-1thread,plugin --mode eager
    .venv/bin/python benchmarks/side_by_side.py --quick                        # smoke run
"""

from __future__ import annotations

import sys

from vllm_x86.bench.harness import main

if __name__ == "__main__":
    sys.exit(main(prog_argv0="benchmarks/side_by_side.py"))
