"""The `vllm-x86` command: main.py (the parser and the serve, pull, quantize, bench, check
subcommands), demo.py (`vllm-x86 demo`), doctor.py (`vllm-x86 doctor`), common.py (what
the daemon and the demo share with the serve command)."""
