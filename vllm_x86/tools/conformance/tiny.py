"""Tiny random-weight checkpoints built from an architecture's transformers config.

A tiny checkpoint keeps what makes an architecture itself (GQA ratio, q/k norms,
biases, sliding windows, MoE routing with several experts, shared experts, MLA ranks,
partial rotary, tied or untied embeddings, hybrid layer patterns) and shrinks what only
makes it big (width, depth, vocabulary). ``shrink_kwargs`` does the generic part from
the config class's own defaults; an architecture's row in ``archs.py`` adds what is
particular to it.

Weights are transformers' own initialisation under a fixed seed, saved in float32,
then the output projection is rescaled so the logits are decisive (standard deviation
``LOGIT_STD``): with near-uniform logits a greedy comparison would mostly measure ties.

Built checkpoints are cached under ``<VLLM_X86_CACHE_DIR>/tiny/<arch>-<hash>``; the
hash covers the config, the seed, this module's format version and the transformers
version, so a change to any of them builds a new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

FORMAT = 5  # bump when the way checkpoints are built changes
SEED = 0
LOGIT_STD = 4.0
LAYER_GAIN = 4.0
PROMPT_LEN = 24
NEW_TOKENS = 16
TOP_K = 8  # best ids kept per greedy step of a reference (for the bf16 near-tie rule)
REF_FORMAT = 2
DONE = ".vllm-x86-tiny.json"

# Generic small values, applied to a config only where its class has the attribute.
# Widths keep head_dim at 32 (the smallest head size vLLM's CPU attention supports).
GENERIC: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "d_model": 128,
    "n_embd": 128,
    "intermediate_size": 256,
    "ffn_dim": 256,
    "ffn_hidden_size": 256,
    "n_inner": 256,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64,
    "expert_ffn_hidden_size": 64,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "n_layers": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "num_key_value_heads": 2,
    "num_kv_heads": 2,
    "head_dim": 32,
    "num_experts": 8,
    "n_routed_experts": 8,
    "num_local_experts": 8,
    "moe_num_experts": 8,
    "num_experts_per_tok": 2,
    "num_experts_per_token": 2,
    "moe_k": 2,
    "moe_topk": 2,
    "top_k_experts": 2,
    "max_position_embeddings": 512,
    "n_positions": 512,
    "max_seq_len": 512,
    "sliding_window": 16,
    "sliding_window_size": 16,
    "first_k_dense_replace": 1,
    "index_topk": 16,
    "index_head_dim": 32,
    "index_n_heads": 2,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_head_dim": 32,
    "linear_num_heads": 4,
    "rotary_dim": 16,
}
# Set only where the default is a positive number (0 or None means "feature off").
GENERIC_IF_ON: dict[str, Any] = {
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "moe_num_shared_experts": 1,
    "shared_intermediate_size": 64,
    "q_lora_rank": 64,
}


def _config_class(arch: str):
    import transformers

    return getattr(transformers, arch).config_class


def shrink_kwargs(defaults: dict[str, Any], extra: dict[str, Any] | None = None) -> dict:
    """Constructor arguments that shrink a config whose defaults are `defaults`."""
    kw: dict[str, Any] = {}
    for k, v in GENERIC.items():
        if k in defaults and defaults[k] is not None and not isinstance(defaults[k], list):
            kw[k] = v
    for k, v in GENERIC_IF_ON.items():
        if isinstance(defaults.get(k), int) and defaults[k] > 0:
            kw[k] = v
    # sliding windows are a feature only where the architecture has one
    for k in ("sliding_window", "sliding_window_size"):
        if k in kw and not defaults.get(k):
            del kw[k]
    # None means "as many as attention heads" in most configs: make it GQA explicitly
    if "num_key_value_heads" in defaults and defaults["num_key_value_heads"] is None:
        kw["num_key_value_heads"] = GENERIC["num_key_value_heads"]
    # special token ids must fall inside the small vocabulary
    vocab = kw.get("vocab_size", defaults.get("vocab_size"))
    for k, small in (("pad_token_id", 0), ("bos_token_id", 1), ("eos_token_id", 2)):
        v = defaults.get(k)
        if isinstance(v, int) and vocab and v >= vocab:
            kw[k] = small
        elif isinstance(v, list) and vocab and any(i >= vocab for i in v):
            kw[k] = [small]
    kw.update(extra or {})
    return kw


def tiny_config(arch: str, extra: dict[str, Any] | None = None):
    """A small config of `arch` (a transformers model class name)."""
    cls = _config_class(arch)
    defaults = cls().to_dict()
    cfg = cls(**shrink_kwargs(defaults, extra))
    cfg.architectures = [arch]
    return cfg


def config_hash(cfg, gain: float = LAYER_GAIN, hub_format: str = "") -> str:
    import transformers

    d = cfg.to_dict()
    d.pop("transformers_version", None)
    key = {"cfg": d, "seed": SEED, "gain": gain, "format": FORMAT, "tf": transformers.__version__}
    if hub_format:  # the rewrite's own code is part of what the checkpoint is
        from vllm_x86.tools.conformance import formats

        key["hub_format"] = formats.fingerprint(hub_format)
    blob = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tiny_root() -> Path:
    from vllm_x86.runtime import envs

    return Path(envs.cache_dir()) / "tiny"


def prompt_ids(vocab_size: int, n: int = PROMPT_LEN, seed: int = SEED) -> list[int]:
    """A fixed pseudo-random prompt (ids 3..vocab-1: clear of the usual special ids)."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(3, vocab_size) for _ in range(n)]


def _final_norm(model):
    """The last normalisation module outside the repeated layers (the one whose output
    the LM head reads), or None."""
    last = None
    for name, mod in model.named_modules():
        parts = name.split(".")
        if any(p.isdigit() for p in parts):
            continue  # inside a layer list
        if "norm" in type(mod).__name__.lower() and getattr(mod, "weight", None) is not None:
            last = mod
    return last


def _amplify_layers(model, gain: float) -> None:
    """Multiply the layers' projection weights by `gain` (default LAYER_GAIN).

    At transformers' initialisation scale (std 0.02) the layers add little to the
    residual stream next to the token embedding, and a tiny model mostly maps the last
    token to the next one: it would pass with attention switched off. Larger
    projections make every block change the result. Embeddings, norms and SSM
    parameters (A_log, dt, conv) keep their initialisation."""
    import torch

    out = model.get_output_embeddings()
    skip = {id(out.weight)} if out is not None else set()
    with torch.no_grad():
        for mod in model.modules():
            linear = isinstance(mod, torch.nn.Linear) or type(mod).__name__ == "Conv1D"
            if linear and id(mod.weight) not in skip:
                mod.weight.mul_(gain)
        for name, p in model.named_parameters():
            if p.ndim == 3 and "experts" in name:  # fused expert weights
                p.mul_(gain)


def _make_decisive(model, prompt: list[int]) -> None:
    """Scale the logits to a standard deviation of LOGIT_STD.

    Untied models: the LM head is scaled. Tied ones: scaling the shared embedding would
    scale the input too (the model would then mostly echo its last token), so the final
    norm's gain is scaled instead (for a norm stored as an offset from 1, as Gemma's,
    the offset is adjusted)."""
    import torch

    out = model.get_output_embeddings()
    if out is None:
        return
    inp = model.get_input_embeddings()
    tied = inp is not None and out.weight.data_ptr() == inp.weight.data_ptr()
    norm = _final_norm(model) if tied else None
    for _ in range(4):
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits.float()
            std = float(logits.std())
            if not (std > 0) or abs(std / LOGIT_STD - 1) < 0.05:
                return
            k = LOGIT_STD / std
            if not tied or norm is None:
                out.weight.mul_(k)
            elif float(norm.weight.abs().max()) == 0.0:  # offset form: (1 + w)
                norm.weight.copy_((1 + norm.weight) * k - 1)
            else:
                norm.weight.mul_(k)
                if getattr(norm, "bias", None) is not None:
                    norm.bias.mul_(k)


@contextlib.contextmanager
def one_thread():
    """torch on one thread for the tiny models' own work here (building, references).
    Their ops are too small to gain from a second thread, and beside a vLLM worker or
    another test on the same cores two threads wait on each other: preparing the first 8
    architectures of the table (checkpoints and references) took 39.8 s with torch's
    two threads and 7.6 s with one, a vLLM engine running beside on the 2-core Xeon VM
    (2026-12-06)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build(
    arch: str, cfg, root: Path | None = None, gain: float = LAYER_GAIN, hub_format: str = ""
) -> Path:
    """Build (or find in the cache) the tiny checkpoint of `cfg`; return its directory.

    `hub_format` names a rewrite in ``formats.py`` that turns what transformers saves
    into the format of the architecture's real checkpoints on the Hub (the one vLLM
    reads), where the two differ."""
    import torch

    from vllm_x86.tools.conformance import formats

    root = root or tiny_root()
    tag = config_hash(cfg, gain, hub_format)
    final = root / f"{arch}-{tag}"
    if (final / DONE).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with one_thread():
        torch.manual_seed(SEED)
        model = model_class(arch)._from_config(cfg, dtype=torch.float32)
        model.eval()
        prompt = prompt_ids(text_config(cfg).vocab_size)
        _amplify_layers(model, gain)
        _make_decisive(model, prompt)
    with tempfile.TemporaryDirectory(prefix=f".{arch}-", dir=root) as tmp:
        out = Path(tmp) / "model"
        original = formats.save_original_format(hub_format) if hub_format else True
        model.save_pretrained(str(out), safe_serialization=True, save_original_format=original)
        if hub_format:
            formats.rewrite(hub_format, out)
        (out / DONE).write_text(json.dumps({"arch": arch, "seed": SEED}) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(out, final)
    return final


def text_config(cfg):
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


# ----------------------------------------------------------------------------- reference


def model_class(arch: str):
    import transformers

    return getattr(transformers, arch)


def _load(model_dir: Path, dtype_name: str):
    import torch

    arch = json.loads((Path(model_dir) / "config.json").read_text())["architectures"][0]
    model = model_class(arch).from_pretrained(str(model_dir), dtype=getattr(torch, dtype_name))
    model.eval()
    return model


def prompt_is_prefix(model_dir: Path) -> bool:
    """True for a PrefixLM checkpoint (config ``prefix_lm: true``, HRM-Text): its prompt
    is one bidirectional block and what follows is causal. vLLM runs such a model that
    way (``PrefillPrefixLMAttention`` in vllm/model_executor/models/hrm_text.py makes
    every prefill bidirectional); transformers does so only when given
    ``token_type_ids`` (1 over the block, modeling_hrm_text.py ``block_sequence_ids``)
    and is causal everywhere without them, so the reference passes them."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return bool(cfg.get("prefix_lm", False))


def _logits(model, seq: list[int], n_prefix: int):
    """The model's logits for `seq`; its first `n_prefix` tokens one bidirectional
    block (PrefixLM), when n_prefix > 0."""
    import torch

    kwargs = {}
    if n_prefix:
        types = [1] * n_prefix + [0] * (len(seq) - n_prefix)
        kwargs["token_type_ids"] = torch.tensor([types])
    return model(torch.tensor([seq]), use_cache=False, **kwargs).logits[0].float()


def reference(
    model_dir: Path, dtype_name: str, prompt: list[int], new_tokens: int, quant: str = ""
) -> dict:
    """transformers' greedy continuation and log-probabilities, without a KV cache.

    With `quant` ("x86_int8" or "x86_int4"), the weights that method quantizes are
    first replaced by their quantized-then-dequantized values (quant/fake.py).

    Each step runs the whole sequence again: slower than a cache, but the cache code of
    an exotic architecture is then no part of the reference. Returns
    ``tokens`` (greedy), ``prompt_logprobs`` (log p of prompt token i given the ones
    before, i >= 1), ``logprobs`` (of each greedy token), ``gaps`` (top-1 minus top-2
    logit at each greedy step), ``top_ids``/``top_vals`` (the TOP_K best ids there and
    their logits). A PrefixLM checkpoint's prompt is its bidirectional block
    (``prompt_is_prefix``)."""
    import torch

    with one_thread():
        model = _load(model_dir, dtype_name)
        n_prefix = len(prompt) if prompt_is_prefix(model_dir) else 0
        if quant:
            from vllm_x86.tools.conformance.fake_quant import fake_quantize

            fake_quantize(model, quant)
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(new_tokens):
                seq.append(int(_logits(model, seq, n_prefix)[-1].argmax()))
            return teacher_forced(model, prompt, seq[len(prompt) :], prefix=bool(n_prefix))


def teacher_forced(model, prompt: list[int], continuation: list[int], prefix: bool = False) -> dict:
    """`reference`'s log-probabilities of `continuation` after `prompt` (`prefix`: the
    prompt is a PrefixLM block)."""
    import torch

    seq = list(prompt) + list(continuation)
    with torch.no_grad():
        logits = _logits(model, seq, len(prompt) if prefix else 0)
    lp = torch.log_softmax(logits, dim=-1)
    ids = torch.tensor(seq)
    tok_lp = lp[:-1].gather(1, ids[1:, None])[:, 0].tolist()  # log p(seq[i+1] | seq[:i+1])
    n = len(prompt)
    top = logits[n - 1 : n - 1 + len(continuation)].topk(TOP_K, dim=-1)
    return {
        "tokens": list(continuation),
        "prompt_logprobs": tok_lp[: n - 1],
        "logprobs": tok_lp[n - 1 :],
        "gaps": (top.values[:, 0] - top.values[:, 1]).tolist(),
        "top_ids": top.indices.tolist(),  # the TOP_K best ids at each greedy step
        "top_vals": top.values.tolist(),  # and their logits
    }


def cached_reference(
    model_dir: Path,
    dtype_name: str,
    prompt: list[int],
    new_tokens: int,
    cache_dir: Path | None = None,
    quant: str = "",
):
    """``reference`` stored beside the checkpoint (or in `cache_dir`) and reused. A
    fake-quantized one (`quant`) is keyed by the quantization options and the code of
    the modules that decide it (quant/scope.py, fake.py, methods.py)."""
    cache = Path(cache_dir or model_dir)
    cache.mkdir(parents=True, exist_ok=True)
    parts: list = [REF_FORMAT, prompt] + (["prefix"] if prompt_is_prefix(Path(model_dir)) else [])
    if quant:
        from vllm_x86.runtime.quant import methods, scope
        from vllm_x86.tools.conformance import fake_quant as fake

        opts = scope.options(fake.METHOD_BITS[quant])
        code = [
            hashlib.sha256(Path(mod.__file__).read_bytes()).hexdigest()
            for mod in (fake, methods, scope)
        ]
        parts += [quant, list(opts), os.environ.get("VLLM_X86_QUANT_KERNEL", ""), code]
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:8]
    label = f"{dtype_name}-{quant}" if quant else dtype_name
    path = cache / f"reference-{label}-{key}-{new_tokens}.json"
    if path.is_file():
        return json.loads(path.read_text())
    ref = reference(Path(model_dir), dtype_name, prompt, new_tokens, quant)
    ref["prompt"] = list(prompt)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ref))
    os.replace(tmp, path)
    return ref
