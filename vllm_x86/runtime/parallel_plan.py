"""The plan per rank for tensor and pipeline parallel: CPUs, NUMA node, weights, KV cache.

A pure module (no vLLM, no torch): it reads the model's config.json and the headers of
its safetensors files, `hardware` and `defaults`, so `vllm-x86 doctor --tp N --pp M`
and `vllm-x86 serve` can show or refuse a layout before any process starts, and the
platform (check_and_update_config) refuses the same layouts for `vllm serve` and the
LLM class with the same sentence.

What it mirrors from vLLM 0.32 (each checked in its source, not guessed):

* tensor parallel splits every decoder layer's attention heads and MLP channels among
  the TP ranks: the attention heads must divide (ModelConfig.verify_with_parallel_config),
  the KV heads must divide or be divided by the TP size (QKVParallelLinear replicates
  KV heads when TP is larger), and the MLP's intermediate size must divide
  (MergedColumnParallelLinear's `divide`, an assertion at model build);
* pipeline parallel gives each PP rank a run of layers (distributed/utils.py,
  get_pp_indices: the remainder goes to the ranks before the last);
* the token embedding lives on the first PP rank and the LM head on the last, both
  split by vocabulary among the TP ranks (VocabParallelEmbedding, ParallelLMHead); with
  tied embeddings and PP the last rank loads the embedding again as its LM head;
* ranks are numbered TP-innermost (rank = pp_rank * TP + tp_rank), which is also the
  order of VLLM_CPU_OMP_THREADS_BIND's "|"-separated lists;
* each rank's KV cache holds its layers and its KV heads (max(1, kv_heads // TP)), and
  lives in the memory of the NUMA node of its first CPU (the CPU worker's memory node);
  `kv_cache_memory_bytes` is per rank.

The safetensors header is read by hand (8 bytes of length, then JSON) rather than with
the `safetensors` package: that needs no import of torch or numpy and reads nothing but
the header, which is all a plan needs.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vllm_x86.runtime import defaults, envs, hardware
from vllm_x86.runtime.defaults import LayoutError
from vllm_x86.runtime.hardware import GiB
from vllm_x86.runtime.quant.groups import effective_group_size

__all__ = [
    "LayoutError",
    "ModelFacts",
    "Plan",
    "RankPlan",
    "model_facts",
    "plan",
    "rank_kv_cache_bytes",
    "refuse",
    "valid_tp_sizes",
]

# floating-point weights, which vLLM loads in the dtype the model runs in
_ITEMSIZE = {"F32": 4, "BF16": 2, "F16": 2}
_DTYPE_ITEMSIZE = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
# Weights of the plugin's load-time quantization (quant/methods.py): bytes per weight,
# with the scales (INT8: one per output channel; INT4: a scale and a zero point per
# group of 128) rounded up into the figure. The embedding and the LM head stay as they are.
_QUANT_BYTES_PER_WEIGHT = {"x86_int8": 1.0 + 4 / 1024, "x86_int4": 0.5 + 4 / 128}
_EMBED = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings)\.")
_HEAD = re.compile(r"(^|\.)(lm_head|output)\.")
_LAYER = re.compile(r"(^|\.)(layers|h|blocks|layer)\.(\d+)\.")


@dataclass(frozen=True)
class ModelFacts:
    """What a plan needs to know about a model (config.json and weight headers)."""

    name: str
    attention_heads: int
    kv_heads: int
    layers: int
    hidden_size: int
    head_dim: int
    intermediate_size: int | None  # the MLP's (the experts' in a MoE model)
    vocab_size: int
    tied_embeddings: bool
    max_context: int | None
    kv_itemsize: int
    # False for MLA, sliding-window and hybrid (Mamba) models: the KV estimate below is
    # then an upper bound, shown but never a reason to refuse
    kv_exact: bool
    embed_bytes: int
    lm_head_bytes: int  # 0 when the LM head is the embedding (tied)
    layer_bytes: tuple[int, ...]
    other_bytes: int  # final norm, vision tower, ...: kept whole on the first PP rank
    weights_source: str
    quantization: str | None = None  # the plugin's load-time quantization, if given
    checkpoint_quantized: bool = False  # a quantization_config in config.json (GPTQ, AWQ, ...)
    weight_itemsize: int = 2  # bytes per weight of the dtype the model runs in
    prepacked: str | None = None  # x86_int8 / x86_int4: a `vllm-x86 quantize` checkpoint
    int4_group_size: int | None = None  # x86_int4 while loading: the configured group size

    @property
    def weight_bytes(self) -> int:
        return self.embed_bytes + self.lm_head_bytes + sum(self.layer_bytes) + self.other_bytes

    def kv_bytes_per_token(self, layers: int, tp: int) -> int:
        """K and V of one token on a rank with `layers` layers in a TP group of `tp`."""
        return 2 * layers * max(1, self.kv_heads // tp) * self.head_dim * self.kv_itemsize


def _text_config(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg.get("llm_config") or cfg


def safetensors_tensors(model_dir: Path) -> dict[str, tuple[str, list[int], int]] | None:
    """name -> (dtype, shape, bytes) from the headers of the directory's safetensors
    files, or None when it has none (or one cannot be read)."""
    return safetensors_file_tensors(sorted(Path(model_dir).glob("*.safetensors")))


def safetensors_file_tensors(files: list[Path]) -> dict[str, tuple[str, list[int], int]] | None:
    """`safetensors_tensors` of the given files (None when there are none, or one
    cannot be read)."""
    if not files:
        return None
    out = {}
    for f in files:
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > 100 << 20:
                    return None
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            return None
        for name, t in header.items():
            if name == "__metadata__":
                continue
            start, end = t["data_offsets"]
            out[name] = (t["dtype"], list(t["shape"]), end - start)
    return out


def model_facts(
    model_dir: str | os.PathLike | None = None,
    cfg: dict | None = None,
    name: str | None = None,
    dtype: str | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str | None = None,
) -> ModelFacts:
    """The facts of a model directory (its config.json and safetensors headers), or of a
    config dict alone (the weights are then estimated from the shape). `dtype` is the
    dtype the model runs in ("auto" or None: the checkpoint's), `quantization` the
    --quantization given (x86_int8 / x86_int4 shrink the layers' weights as loaded),
    `kv_cache_dtype` vLLM's --kv-cache-dtype (fp8: a byte per value)."""
    path = Path(model_dir).expanduser() if model_dir is not None else None
    if cfg is None:
        if path is None:
            raise ValueError("model_facts needs a model directory or a config")
        cfg = json.loads((path / "config.json").read_text())
    text = _text_config(cfg)
    heads = int(text["num_attention_heads"])
    layers = int(text["num_hidden_layers"])
    hidden = int(text["hidden_size"])
    kv_heads = text.get("num_key_value_heads") or text.get("num_kv_heads")
    kv_heads = int(kv_heads or (1 if text.get("multi_query") else heads))
    head_dim = int(text.get("head_dim") or hidden // heads)
    # the MLP channels TP splits: the experts' in a mixture-of-experts model
    moe = any(k in text for k in ("num_experts", "num_local_experts", "n_routed_experts"))
    inter = text.get("moe_intermediate_size") if moe else text.get("intermediate_size")
    inter = int(inter) if isinstance(inter, int) and inter > 0 else None
    vocab = int(text.get("vocab_size") or cfg.get("vocab_size") or 0)
    tied = bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    max_ctx = text.get("max_position_embeddings") or cfg.get("max_position_embeddings")
    ckpt_dtype = str(text.get("dtype") or text.get("torch_dtype") or "bfloat16")
    run_dtype = ckpt_dtype if dtype in (None, "", "auto") else str(dtype)
    run_dtype = run_dtype.removeprefix("torch.")
    kv_itemsize = _DTYPE_ITEMSIZE.get(run_dtype, 2)
    if kv_cache_dtype and "fp8" in str(kv_cache_dtype):
        kv_itemsize = 1
    layer_types = text.get("layer_types") or []
    kv_exact = not (
        "kv_lora_rank" in text
        or text.get("sliding_window") not in (None, 0)
        or any(t != "full_attention" for t in layer_types)
        or any(k in text for k in ("mamba_d_state", "ssm_state_size", "linear_num_key_heads"))
    )
    prequantized = "quantization_config" in cfg or "quantization_config" in text
    qcfg = cfg.get("quantization_config") or text.get("quantization_config") or {}
    prepacked = (
        qcfg.get("quant_method") if qcfg.get("quant_method") in ("x86_int8", "x86_int4") else None
    )
    quant = quantization if quantization in _QUANT_BYTES_PER_WEIGHT and not prequantized else None

    embed = head = other = 0
    per_layer = [0] * layers
    tensors = safetensors_tensors(path) if path is not None else None
    if tensors is not None:
        source = f"safetensors headers ({len(list(path.glob('*.safetensors')))} file(s))"
        for tname, (tdtype, shape, nbytes) in tensors.items():
            if tdtype in _ITEMSIZE and run_dtype in _DTYPE_ITEMSIZE and not prequantized:
                nbytes = nbytes * _DTYPE_ITEMSIZE[run_dtype] // _ITEMSIZE[tdtype]
            m = _LAYER.search(tname)
            if _EMBED.search(tname):
                embed += nbytes
            elif _HEAD.search(tname) and not m:
                head += nbytes
            elif m and int(m.group(3)) < layers:
                if quant and len(shape) == 2 and tdtype in _ITEMSIZE:
                    nbytes = int(shape[0] * shape[1] * _QUANT_BYTES_PER_WEIGHT[quant])
                per_layer[int(m.group(3))] += nbytes
            else:
                other += nbytes
    else:
        source = "estimated from config.json (no safetensors files)"
        itemsize = _DTYPE_ITEMSIZE.get(run_dtype, 2)
        mlp = 3 * hidden * (inter or 4 * hidden)
        attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
        per_weight = _QUANT_BYTES_PER_WEIGHT[quant] if quant else itemsize
        per_layer = [int((mlp + attn) * per_weight) + 2 * hidden * itemsize] * layers
        embed = vocab * hidden * itemsize
        head = 0 if tied else embed
        other = hidden * itemsize
    if quant:
        source += f", layers as {quant} loads them"
    if path is not None and name is None:
        name = path.name
    return ModelFacts(
        name=name or str(text.get("_name_or_path") or "the model"),
        attention_heads=heads,
        kv_heads=kv_heads,
        layers=layers,
        hidden_size=hidden,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied and head == 0,
        max_context=int(max_ctx) if max_ctx else None,
        kv_itemsize=kv_itemsize,
        kv_exact=kv_exact,
        embed_bytes=embed,
        lm_head_bytes=head,
        layer_bytes=tuple(per_layer),
        other_bytes=other,
        weights_source=source,
        quantization=quant,
        checkpoint_quantized=prequantized,
        weight_itemsize=_DTYPE_ITEMSIZE.get(run_dtype, 2),
        prepacked=prepacked,
        int4_group_size=(
            _int4_group_size()
            if quant == "x86_int4"
            else (int(qcfg.get("group_size") or 128) if prepacked == "x86_int4" else None)
        ),
    )


def _int4_group_size() -> int | None:
    try:
        return int(envs.get("VLLM_X86_QUANT_GROUP_SIZE"))
    except ValueError:  # the quantization config says what is wrong with it
        return None


# ----------------------------------------------------------------------------- rules


def _tp_problem(facts: ModelFacts, tp: int) -> str | None:
    """Why vLLM cannot split this model `tp` ways, or None."""
    if facts.attention_heads % tp:
        return f"has {facts.attention_heads} attention heads: --tensor-parallel-size {tp} does not divide them"
    kv = facts.kv_heads
    if (kv % tp) if tp < kv else (tp % kv):
        return (
            f"has {kv} KV heads: --tensor-parallel-size {tp} neither divides them nor is a "
            "multiple of them"
        )
    if facts.intermediate_size and facts.intermediate_size % tp:
        return (
            f"has an MLP of {facts.intermediate_size} channels: --tensor-parallel-size {tp} "
            "does not divide them"
        )
    return _int4_split_problem(facts, tp)


def _int4_split_problem(facts: ModelFacts, tp: int) -> str | None:
    """x86_int4 (while loading, or a prepacked checkpoint) splits the row-parallel layers'
    input channels (attention output, MLP down projection) over the TP ranks; each
    rank's share must hold whole groups of the size the layer uses at one rank
    (quant/linear.py refuses it in the worker otherwise)."""
    gs = facts.int4_group_size
    if tp == 1 or not gs:
        return None
    for what, k in (
        ("attention output", facts.attention_heads * facts.head_dim),
        ("MLP down projection", facts.intermediate_size),
    ):
        if not k or k % tp:
            continue
        g = effective_group_size(k, gs)
        if g and (k // tp) % g:
            fits = effective_group_size(k // tp, gs)
            hint = f" (VLLM_X86_QUANT_GROUP_SIZE={fits} would)" if fits else ""
            return (
                f"in x86_int4 quantizes its {what}'s {k} input channels in "
                f"groups of {g}: --tensor-parallel-size {tp} leaves {k // tp} per rank, which "
                f"the groups do not divide{hint}"
            )
    return None


def valid_tp_sizes(facts: ModelFacts, most: int) -> list[int]:
    """The tensor parallel sizes from 1 to `most` that vLLM can split this model by."""
    return [t for t in range(1, max(1, most) + 1) if _tp_problem(facts, t) is None]


def _or_list(items: list) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def pp_layers(layers: int, pp: int) -> list[tuple[int, int]]:
    """(first, last + 1) layer of each PP rank, as vLLM's get_pp_indices splits them
    (without VLLM_PP_LAYER_PARTITION)."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    out, start = [], 0
    for n in parts:
        out.append((start, start + n))
        start += n
    return out


def check_shape(facts: ModelFacts, tp: int, pp: int, cores: int) -> None:
    """LayoutError when vLLM cannot split the model `tp` x `pp` ways; the sentence says
    which layouts would work on `cores` physical cores."""
    if tp < 1 or pp < 1:
        raise LayoutError("--tensor-parallel-size and --pipeline-parallel-size must be at least 1")
    problem = _tp_problem(facts, tp)
    if problem:
        ranks = tp * pp
        alt = []
        if ranks <= facts.layers and ranks <= cores:
            alt.append(
                f"--pipeline-parallel-size {ranks}"
                if pp == 1
                else f"--tensor-parallel-size 1 --pipeline-parallel-size {ranks}"
            )
        sizes = valid_tp_sizes(facts, cores // pp)
        alt.append(f"a tensor parallel size of {_or_list(sizes)}")
        more = [t for t in valid_tp_sizes(facts, facts.attention_heads) if t not in sizes]
        also = (
            f" ({_or_list(more)} would need more than this machine's {cores} cores)" if more else ""
        )
        raise LayoutError(f"{facts.name} {problem}; use {', or '.join(alt)}{also}")
    if pp > facts.layers:
        raise LayoutError(
            f"{facts.name} has {facts.layers} layers: --pipeline-parallel-size {pp} leaves "
            f"ranks without a layer; use a pipeline parallel size of at most "
            f"{min(facts.layers, max(1, cores // tp))}"
        )


# ----------------------------------------------------------------------------- plan


@dataclass
class RankPlan:
    rank: int
    tp_rank: int
    pp_rank: int
    cpus: str  # the rank's compute threads, as in VLLM_CPU_OMP_THREADS_BIND
    node: int  # NUMA node of its first CPU: where its weights and KV cache live
    memory: str  # the memory pool it plans with ("NUMA node 1", "the machine")
    layers: tuple[int, int]  # first, last + 1
    holds: list[str]  # "embedding 1/2", "LM head 1/2", ...
    weight_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int


@dataclass
class Plan:
    model: str
    tp: int
    pp: int
    max_model_len: int | None
    threads_why: str
    kv_why: str
    weights_source: str
    ranks: list[RankPlan] = field(default_factory=list)
    pools: dict[str, dict] = field(default_factory=dict)  # memory pool -> figures
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        lines = [
            f"Plan for {self.model}: tensor parallel {self.tp} x pipeline parallel {self.pp} "
            f"= {len(self.ranks)} rank(s), max model length {self.max_model_len}",
            f"  threads : {self.threads_why}",
            f"  KV cache: {self.kv_why}",
            f"  weights : {self.weights_source}",
            "  each rank's weights and KV cache live in its node's memory (the NUMA node of "
            "its first CPU)",
            "",
            f"  {'rank':>4} {'tp':>3} {'pp':>3}  {'CPUs':<14} {'node':>4}  {'layers':<9} "
            f"{'weights GiB':>11} {'KV GiB':>7}  holds",
        ]
        for r in self.ranks:
            layers = f"{r.layers[0]}-{r.layers[1] - 1}" if r.layers[1] > r.layers[0] else "none"
            lines.append(
                f"  {r.rank:>4} {r.tp_rank:>3} {r.pp_rank:>3}  {r.cpus:<14} {r.node:>4}  "
                f"{layers:<9} {r.weight_bytes / GiB:>11.3f} {r.kv_bytes / GiB:>7.2f}  "
                + (", ".join(r.holds) or "-")
            )
        lines.append("")
        for pool, p in self.pools.items():
            lines.append(
                f"  memory of {pool}: {p['ranks']} rank(s) take {p['planned_gib']:.2f} GiB "
                f"(weights {p['weights_gib']:.2f} + KV cache {p['kv_gib']:.2f}) of "
                f"{p['available_gib']:.1f} GiB available ({p['source']})"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


MemoryFn = Callable[[int], hardware.MemoryInfo]


def _pool_name(mem: hardware.MemoryInfo, node: int) -> str:
    return f"NUMA node {node}" if mem.source.startswith("NUMA node") else "the machine"


def memory_pools(
    cpu: hardware.CpuInfo, ranks: int, memory: MemoryFn | None = None
) -> tuple[list[int], dict[str, tuple[hardware.MemoryInfo, list[int]]]]:
    """(node of each rank, memory pool -> (its MemoryInfo, the ranks planning with it)).

    Ranks whose nodes report trustworthy memory of their own (hardware.memory_info)
    each plan with their node's memory; otherwise all ranks share the machine's."""
    memory = memory or hardware.memory_info
    parts = defaults.rank_cpus(cpu, ranks)
    node_of_cpu = {c: n for n, cs in cpu.cpus_by_node.items() for c in cs}
    nodes = [node_of_cpu.get(p[0], cpu.numa_nodes[0]) for p in parts]
    pools: dict[str, tuple[hardware.MemoryInfo, list[int]]] = {}
    for rank, node in enumerate(nodes):
        mem = memory(node)
        name = _pool_name(mem, node)
        pools.setdefault(name, (mem, []))[1].append(rank)
    return nodes, pools


def rank_kv_cache_bytes(
    bytes_per_token: int | None,
    max_model_len: int | None,
    ranks: int = 1,
    cpu: hardware.CpuInfo | None = None,
    memory: MemoryFn | None = None,
) -> tuple[int, str]:
    """The plugin's KV cache per rank (vLLM's kv_cache_memory_bytes, one value for every
    rank): defaults.choose_kv_cache_bytes for the pool with the least memory per rank,
    its share divided among the ranks that plan with it."""
    cpu = cpu or hardware.cpu_info()
    _, pools = memory_pools(cpu, ranks, memory)
    best = None
    for pool, (mem, members) in pools.items():
        size, why = defaults.choose_kv_cache_bytes(
            mem, bytes_per_token, max_model_len, ranks=len(members)
        )
        if len(pools) > 1:
            why = f"{why}; the least of each memory's share: {len(members)} rank(s) on {pool}"
        if best is None or size < best[0]:
            best = (size, why)
    return best


def plan(
    facts: ModelFacts,
    tp: int = 1,
    pp: int = 1,
    cpu: hardware.CpuInfo | None = None,
    memory: MemoryFn | None = None,
    max_model_len: int | None = None,
    kv_cache_bytes: int | None = None,
    kv_why: str | None = None,
) -> Plan:
    """The plan per rank, or LayoutError with a sentence that says what would work.

    `kv_cache_bytes` is the KV cache per rank the user chose (None: the plugin's
    default, rank_kv_cache_bytes); `memory(node)` gives a node's MemoryInfo
    (hardware.memory_info by default)."""
    cpu = cpu or hardware.cpu_info()
    memory = memory or hardware.memory_info
    cores = sum(len(c) for c in defaults.node_cores(cpu).values())
    check_shape(facts, tp, pp, cores)
    ranks = tp * pp
    bind, threads_why = defaults.choose_threads(cpu, ranks=ranks)  # LayoutError: > cores
    nodes, pools = memory_pools(cpu, ranks, memory)
    if bind is None:
        cpu_lists = ["vLLM auto"]
    else:
        cpu_lists = bind.split("|")
    max_len = max_model_len or facts.max_context
    auto_len = max_len is not None and max_len <= 0  # --max-model-len -1: vLLM fits it
    if auto_len:
        max_len = facts.max_context
    split = pp_layers(facts.layers, pp)
    per_token = [facts.kv_bytes_per_token(b - a, tp) for a, b in split]
    if kv_cache_bytes is None:
        kv_cache_bytes, why = rank_kv_cache_bytes(max(per_token), max_len, ranks, cpu, memory)
        kv_why = kv_why or why
    out = Plan(
        model=facts.name,
        tp=tp,
        pp=pp,
        max_model_len=max_len,
        threads_why=threads_why,
        kv_why=kv_why
        or (
            f"{kv_cache_bytes / GiB:.2f} GiB per rank, as you chose"
            if kv_cache_bytes
            else "sized by each worker from --gpu-memory-utilization; the plan counts the "
            "weights alone"
        ),
        weights_source=facts.weights_source,
    )
    pool_of = {r: name for name, (_, members) in pools.items() for r in members}
    for rank in range(ranks):
        pp_rank, tp_rank = divmod(rank, tp)
        first, last = split[pp_rank]
        weights = sum(facts.layer_bytes[first:last]) // tp
        holds = []
        frac = f" 1/{tp}" if tp > 1 else ""
        if pp_rank == 0:
            weights += facts.embed_bytes // tp + facts.other_bytes
            holds.append("embedding" + frac)
        if pp_rank == pp - 1:
            if facts.lm_head_bytes:
                weights += facts.lm_head_bytes // tp
                holds.append("LM head" + frac)
            elif pp > 1:  # tied: the last rank loads the embedding as its LM head
                weights += facts.embed_bytes // tp
                holds.append("LM head" + frac + " (a copy of the tied embedding)")
            else:
                holds[-1] += " = LM head (tied)"
        out.ranks.append(
            RankPlan(
                rank=rank,
                tp_rank=tp_rank,
                pp_rank=pp_rank,
                cpus=cpu_lists[rank] if rank < len(cpu_lists) else cpu_lists[-1],
                node=nodes[rank],
                memory=pool_of[rank],
                layers=(first, last),
                holds=holds,
                weight_bytes=weights,
                kv_bytes=kv_cache_bytes,
                kv_bytes_per_token=per_token[pp_rank],
            )
        )
    if ranks > 1 and len(pools) == 1 and "the machine" in pools:
        out.notes.append(
            "all ranks plan with the machine's memory (one NUMA node, or nodes that do not "
            "report their memory reliably): their KV caches share it, and more ranks do not "
            "add memory"
        )
    if facts.kv_exact is False:
        out.notes.append(
            "the KV figures assume full attention in every layer; this model's (MLA, "
            "sliding window or state-space layers) takes less"
        )
    if auto_len:
        out.notes.append("--max-model-len -1: vLLM fits the context length to the KV cache")
    elif max_len and facts.kv_exact and 0 < kv_cache_bytes < max(per_token) * max_len:
        out.notes.append(
            f"a KV cache of {kv_cache_bytes / GiB:.2f} GiB per rank holds less than one "
            f"sequence of {max_len} tokens ({max(per_token) * max_len / GiB:.2f} GiB): vLLM "
            "will refuse to start; give a smaller --max-model-len"
        )
    _check_memory(out, facts, pools, None if auto_len else max_len)
    return out


def _check_memory(out: Plan, facts: ModelFacts, pools, max_len: int | None) -> None:
    """Fill out.pools; LayoutError when a pool's ranks need more memory than it has."""
    by_rank = {r.rank: r for r in out.ranks}
    for name, (mem, members) in pools.items():
        weights = sum(by_rank[r].weight_bytes for r in members)
        kv = sum(by_rank[r].kv_bytes for r in members)
        out.pools[name] = {
            "ranks": len(members),
            "weights_gib": weights / GiB,
            "kv_gib": kv / GiB,
            "planned_gib": (weights + kv) / GiB,
            "available_gib": mem.available / GiB,
            "source": mem.source,
        }
        # one sequence of the full length is the least KV cache vLLM starts with (with
        # --max-model-len -1 vLLM fits the length to the cache instead)
        one_seq = sum(by_rank[r].kv_bytes_per_token for r in members) * max(max_len or 0, 0)
        need_kv = one_seq if facts.kv_exact else 0
        if weights + need_kv <= mem.available:
            continue
        what = (
            f"{len(members)} rank(s) on {name} need {weights / GiB:.2f} GiB of weights"
            + (
                f" and {need_kv / GiB:.2f} GiB of KV cache for one sequence of {max_len} tokens"
                if need_kv
                else ""
            )
            + f", but {mem.available / GiB:.2f} GiB are available ({mem.source})"
        )
        fixes = []
        per_token_sum = sum(by_rank[r].kv_bytes_per_token for r in members)
        # what is suggested leaves room for the runtime: 2 GiB (a tenth on small memory)
        usable = mem.available - min(2 * GiB, mem.available // 10)
        room = usable - weights
        if need_kv and room > 0 and per_token_sum:
            fits = int(room // per_token_sum) // 256 * 256
            if fits >= 256:
                fixes.append(f"a --max-model-len of at most {fits}")
        if facts.quantization is None and not facts.checkpoint_quantized:
            # the layers' weights shrink; the embedding and LM head stay
            layers = sum(
                sum(facts.layer_bytes[slice(*by_rank[r].layers)]) // out.tp for r in members
            )
            for q, per_weight in _QUANT_BYTES_PER_WEIGHT.items():
                smaller = weights - layers + layers * per_weight / facts.weight_itemsize
                if smaller + need_kv <= usable:
                    fixes.append(f"--quantization {q} ({smaller / GiB:.2f} GiB of weights)")
                    break
        if name == "the machine":
            fixes.append("a machine with more memory (ranks that share one memory do not add any)")
        else:
            fixes.append("more ranks, so that each NUMA node holds a smaller part of the model")
        raise LayoutError(f"{facts.name}: {what}; use {', or '.join(fixes)}")


def refuse(
    facts: ModelFacts,
    tp: int,
    pp: int,
    max_model_len: int | None = None,
    kv_cache_bytes: int | None = None,
    local: bool = True,
    cpu: hardware.CpuInfo | None = None,
    memory: MemoryFn | None = None,
    environ: dict[str, str] | None = None,
) -> Plan | None:
    """LayoutError for a layout that cannot run here, else the plan (None when only the
    model's shape could be checked). The one check of `vllm-x86 serve` and the platform.

    Only the shape (heads, layers) is checked when the ranks are not all on this machine
    (`local` False: data parallel or several nodes) or when you chose the thread layout
    yourself (VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_NUM_OF_RESERVED_CPU): the plugin then
    does not place the ranks, so it does not say where they would not fit."""
    env = os.environ if environ is None else environ
    cpu = cpu or hardware.cpu_info()
    if not local or any(
        env.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")
    ):
        check_shape(facts, tp, pp, max(cpu.physical_cores, tp * pp))
        return None
    return plan(
        facts, tp, pp, cpu=cpu, memory=memory, max_model_len=max_model_len,
        kv_cache_bytes=kv_cache_bytes,
    )  # fmt: skip
