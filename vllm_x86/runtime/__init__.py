"""The runtime: what vLLM loads inside its own processes when the plugin is active.

platform.py (the platform class and its config defaults), worker.py (the CPU worker's
hooks), hardware.py (what this CPU is, probed once), defaults.py (threads, memory, KV
cache), envs.py (every VLLM_X86_* setting), patches/ (the ledger of every change to
installed code's behaviour), ops/ (the op table, kernels' Python side, references),
csrc/ (the C++ kernels), quant/ (quantization configs, linear methods, packed formats),
startup/ (compile cache, staged warm-up, KV allocation).

The runtime never imports ``vllm_x86.tools`` (tests/unit/test_layers.py checks it).
"""
