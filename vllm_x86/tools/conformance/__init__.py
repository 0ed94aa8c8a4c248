"""The conformance suite: every architecture vLLM supports, built as a tiny random model
(tiny.py, formats.py, archs.py), run through vLLM with the plugin and compared with
transformers (conformance.py, suite.py), the quantized modes against a fake-quantized
reference (fake_quant.py, routing.py), the supported-models matrix (matrix.py) and
`vllm-x86 check` (check.py)."""
