"""`vllm-x86 bench`: contenders side by side on one model, on one machine, in one run.

Every performance claim of the project is a ratio measured here. The pieces:

- ``contenders``: who is measured (the plugin, stock vLLM CPU, llama.cpp, variants) and
  the exact environment and command each one gets;
- ``workload``: the fixed prompts (as token ids, identical for every contender) and the
  figures measured;
- ``server``: one measurement of a vLLM contender through its real OpenAI server, from
  process start to shutdown (start-up to first token, TTFT, decode at 1/8/32 requests);
- ``llamacpp_child``: the same measurement for llama.cpp through llama-cpp-python, in a
  fresh process;
- ``proctree``: peak memory of a whole process tree;
- ``bandwidth``: the machine's streaming-read bandwidth, 1 thread and all threads;
- ``roofline``: weight bytes read per decoded token, and the decode speed limit they set;
- ``synthetic``: random-weight models of real shapes, with real tokenizers;
- ``gguf_export``: a model directory as a GGUF file, for llama.cpp;
- ``report``: medians, ranges, per-round ratios, the markdown table, the JSON, the chart;
- ``harness``: the command line and the A B A B loop that ties them together;
- ``load``: the load and leak test of the server (vLLM's own serving benchmark, mixed
  lengths, streamed and not; ``python -m vllm_x86.tools.bench.load``, docs/reliability.md).
"""
