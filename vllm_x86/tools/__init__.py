"""The tools people run, built on the runtime: the `vllm-x86` command line (cli/), the
standby daemon (daemon/), the side-by-side benchmarks (bench/), the conformance suite
(conformance/), the model catalog and its downloads (models/), the converter, GPTQ and
quality runs (quantize/).

Tools import the runtime; the runtime never imports tools.
"""
