"""The plan per rank (runtime/parallel_plan.py) on synthetic machines and models, and the
CLI around it: `vllm-x86 doctor --tp/--pp` and `vllm-x86 serve` refusing a layout before
anything starts."""

from __future__ import annotations

import json
import socket
import struct
import subprocess

import pytest

from tests.conftest import PYTHON, clean_env
from tests.helpers.machines import cpu
from vllm_x86.runtime import defaults, hardware, parallel_plan
from vllm_x86.runtime.hardware import GiB
from vllm_x86.runtime.parallel_plan import LayoutError


def machine_memory(avail_gib: float):
    """One memory for every node (a VM, or nodes whose numbers are not trusted)."""
    mem = hardware.MemoryInfo(
        total=int(avail_gib * GiB), available=int(avail_gib * GiB), source="system (test)"
    )
    return lambda node: mem


def node_memory(avail_gib: float):
    """Each NUMA node with memory of its own (a 2-socket server)."""
    return lambda node: hardware.MemoryInfo(
        total=int(avail_gib * GiB), available=int(avail_gib * GiB), source=f"NUMA node {node}"
    )


SMOLLM2 = {  # the default model's config.json: 9 heads, 3 KV heads, tied embeddings
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "head_dim": 64,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "dtype": "bfloat16",
}
LLAMA_8B = {
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "dtype": "bfloat16",
}


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch):
    for k in ("VLLM_X86_THREADS", "VLLM_X86_KV_CACHE_GIB"):
        monkeypatch.delenv(k, raising=False)


def facts(cfg: dict, name: str = "SmolLM2", **changes) -> parallel_plan.ModelFacts:
    return parallel_plan.model_facts(cfg={**cfg, **changes}, name=name)


def test_nine_heads_on_a_two_core_vm_name_what_would_work():
    with pytest.raises(LayoutError) as e:
        parallel_plan.plan(facts(SMOLLM2), tp=2, cpu=cpu(2), memory=machine_memory(20))
    assert str(e.value) == (
        "SmolLM2 has 9 attention heads: --tensor-parallel-size 2 does not divide them; use "
        "--pipeline-parallel-size 2, or a tensor parallel size of 1 (3 would need more than "
        "this machine's 2 cores)"
    )


def test_nine_heads_on_a_big_machine_list_every_size_vllm_can_split():
    # 9 divides the heads, but not the MLP's 1536 channels (vLLM asserts it at build)
    assert parallel_plan.valid_tp_sizes(facts(SMOLLM2), 64) == [1, 3]
    with pytest.raises(LayoutError, match="use --pipeline-parallel-size 2, or a tensor "
                       r"parallel size of 1 or 3$"):  # fmt: skip
        parallel_plan.plan(facts(SMOLLM2), tp=2, cpu=cpu(64, nodes=2), memory=node_memory(100))
    with pytest.raises(LayoutError, match="an MLP of 1536 channels: --tensor-parallel-size 9"):
        parallel_plan.plan(facts(SMOLLM2), tp=9, cpu=cpu(64), memory=machine_memory(100))


def test_kv_heads_follow_vllms_rule():
    # vLLM replicates KV heads when TP is a multiple of them, else TP must divide them
    # 12 heads: 2 and 4 divide them, but neither divides nor is a multiple of 3 KV heads
    assert parallel_plan.valid_tp_sizes(facts(SMOLLM2, num_attention_heads=12), 12) == [
        1,
        3,
        6,
        12,
    ]
    six = facts(SMOLLM2, num_attention_heads=6, intermediate_size=1536)
    with pytest.raises(LayoutError, match="has 3 KV heads: --tensor-parallel-size 2 neither"):
        parallel_plan.plan(six, tp=2, cpu=cpu(8), memory=machine_memory(20))
    two_kv = facts(SMOLLM2, num_attention_heads=8, num_key_value_heads=2)
    assert parallel_plan.valid_tp_sizes(two_kv, 8) == [1, 2, 4, 8]


def test_int4_groups_that_a_ranks_share_would_cut_are_refused(monkeypatch):
    """What the worker would refuse at load (quant/linear.py), the plan refuses before
    anything starts: x86_int4 groups, while loading or in a prepacked checkpoint, that a
    rank's share of a row-parallel layer's input channels would cut."""
    tiny = {**LLAMA_8B, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "hidden_size": 128, "intermediate_size": 512}  # fmt: skip
    monkeypatch.setenv("VLLM_X86_QUANT_GROUP_SIZE", "128")
    int4 = parallel_plan.model_facts(cfg=tiny, name="tiny", quantization="x86_int4")
    with pytest.raises(LayoutError) as e:  # o_proj: K = 4 x 32 = 128, 64 per rank
        parallel_plan.plan(int4, tp=2, cpu=cpu(2), memory=machine_memory(20))
    assert "attention output's 128 input channels in groups of 128" in str(e.value)
    assert "VLLM_X86_QUANT_GROUP_SIZE=64 would" in str(e.value)
    assert "use --pipeline-parallel-size 2, or a tensor parallel size of 1" in str(e.value)
    monkeypatch.setenv("VLLM_X86_QUANT_GROUP_SIZE", "64")
    int4 = parallel_plan.model_facts(cfg=tiny, name="tiny", quantization="x86_int4")
    assert parallel_plan.plan(int4, tp=2, cpu=cpu(2), memory=machine_memory(20)).tp == 2
    # a prepacked checkpoint: its own group size, whatever the environment says
    packed = {**tiny, "quantization_config": {"quant_method": "x86_int4", "group_size": 128}}
    with pytest.raises(LayoutError, match="in groups of 128: --tensor-parallel-size 2"):
        parallel_plan.plan(facts(packed), tp=2, cpu=cpu(2), memory=machine_memory(20))
    packed["quantization_config"]["group_size"] = 64
    assert parallel_plan.plan(facts(packed), tp=2, cpu=cpu(2), memory=machine_memory(20)).tp == 2


def test_more_pipeline_ranks_than_layers_is_refused():
    with pytest.raises(LayoutError, match="has 2 layers: --pipeline-parallel-size 4 leaves "
                       "ranks without a layer; use a pipeline parallel size of at most 2"):  # fmt: skip
        parallel_plan.plan(
            facts(SMOLLM2, num_hidden_layers=2), pp=4, cpu=cpu(8), memory=machine_memory(20)
        )


def test_eight_ranks_on_four_cores_is_refused():
    with pytest.raises(LayoutError, match="8 ranks need at least 8 physical cores.*at most 4"):
        parallel_plan.plan(facts(SMOLLM2), tp=1, pp=8, cpu=cpu(4), memory=machine_memory(20))


def test_pipeline_split_matches_vllm_and_places_the_tied_embedding_twice():
    # vLLM's get_pp_indices: the remainder goes to the ranks before the last
    assert parallel_plan.pp_layers(30, 4) == [(0, 7), (7, 15), (15, 23), (23, 30)]
    assert parallel_plan.pp_layers(30, 2) == [(0, 15), (15, 30)]
    f = facts(SMOLLM2)
    p = parallel_plan.plan(f, pp=2, cpu=cpu(2), memory=machine_memory(20))
    first, last = p.ranks
    assert (first.cpus, last.cpus) == ("0", "1")
    assert first.holds == ["embedding"]
    assert last.holds == ["LM head (a copy of the tied embedding)"]
    layer = f.layer_bytes[0]
    assert first.weight_bytes == 15 * layer + f.embed_bytes + f.other_bytes
    assert last.weight_bytes == 15 * layer + f.embed_bytes
    # each rank's KV cache holds its own 15 layers' 3 KV heads
    assert first.kv_bytes_per_token == 2 * 15 * 3 * 64 * 2
    single = parallel_plan.plan(f, cpu=cpu(2), memory=machine_memory(20)).ranks[0]
    assert single.holds == ["embedding = LM head (tied)"]


def test_tensor_parallel_ranks_are_numbered_tp_innermost_and_split_the_weights():
    f = facts(LLAMA_8B, name="Llama", max_position_embeddings=8192)
    p = parallel_plan.plan(f, tp=2, pp=2, cpu=cpu(8), memory=machine_memory(200))
    assert [(r.tp_rank, r.pp_rank) for r in p.ranks] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert p.ranks[0].holds == ["embedding 1/2"] and p.ranks[3].holds == ["LM head 1/2"]
    assert p.ranks[0].weight_bytes == sum(f.layer_bytes[:16]) // 2 + f.embed_bytes // 2 + (
        f.other_bytes
    )
    # 8 KV heads over TP 2: 4 per rank, 16 layers per PP rank
    assert p.ranks[0].kv_bytes_per_token == 2 * 16 * 4 * 128 * 2


def test_two_socket_server_puts_each_rank_on_its_node_with_its_nodes_memory():
    f = facts(LLAMA_8B, name="Llama", max_position_embeddings=8192)
    p = parallel_plan.plan(f, tp=2, cpu=cpu(64, nodes=2), memory=node_memory(100))
    assert [(r.cpus, r.node, r.memory) for r in p.ranks] == [
        ("0-30", 0, "NUMA node 0"),
        ("32-62", 1, "NUMA node 1"),
    ]
    # alone on its node, a rank gets the KV cache a single rank would get there
    alone, _ = defaults.choose_kv_cache_bytes(
        node_memory(100)(0), p.ranks[0].kv_bytes_per_token, 8192
    )
    assert p.ranks[0].kv_bytes == alone
    assert set(p.pools) == {"NUMA node 0", "NUMA node 1"}


def test_ranks_sharing_one_memory_share_its_kv_cache():
    f = facts(LLAMA_8B, name="Llama")  # 128k context: the quarter of memory is the cap
    one = parallel_plan.plan(f, cpu=cpu(8), memory=machine_memory(100)).ranks[0].kv_bytes
    assert one == 25 * GiB
    two = parallel_plan.plan(f, pp=2, cpu=cpu(8), memory=machine_memory(100))
    assert [r.kv_bytes for r in two.ranks] == [int(12.5 * GiB)] * 2
    assert "shared by 2 ranks" in two.kv_why
    assert "more ranks do not add memory" in " ".join(two.notes)
    # the 1 GiB floor is shared too: two SmolLM2 stages hold half a token each, and
    # together as many tokens as one rank with 1 GiB
    single = parallel_plan.plan(facts(SMOLLM2), cpu=cpu(2), memory=machine_memory(20))
    halves = parallel_plan.plan(facts(SMOLLM2), pp=2, cpu=cpu(2), memory=machine_memory(20))
    assert single.ranks[0].kv_bytes == 1 * GiB
    assert [r.kv_bytes for r in halves.ranks] == [GiB // 2] * 2
    # the same machine: still one pool, and the ranks together keep 2 GiB free
    small = parallel_plan.rank_kv_cache_bytes(10**6, 8192, 4, cpu(8), machine_memory(3))
    assert small[0] * 4 <= 1 * GiB + 4 * (64 << 20)


def test_weights_and_kv_over_the_memory_are_refused_with_what_would_fit():
    f = facts(LLAMA_8B, name="Llama")  # ~15 GiB of bf16 weights, 16 GiB of KV per sequence
    with pytest.raises(LayoutError) as e:
        parallel_plan.plan(f, cpu=cpu(8), memory=machine_memory(24))
    msg = str(e.value)
    assert msg.startswith("Llama: 1 rank(s) on the machine need 14.96 GiB of weights and ")
    assert "GiB of KV cache for one sequence of 131072 tokens, but 24.00 GiB are available" in msg
    assert "use a --max-model-len of at most " in msg
    # suggestions leave 2 GiB to the runtime: INT8 weights (8.2 GiB) and one sequence
    # are still too much, INT4 fits
    assert "or --quantization x86_int4 (5.41 GiB of weights), or a machine with more " in msg
    assert "x86_int8" not in msg
    fits = int(msg.split("at most ")[1].split(",")[0])
    assert fits == 57600  # (24 - 2 - 14.96) GiB of 128 KiB tokens, in steps of 256
    parallel_plan.plan(f, cpu=cpu(8), memory=machine_memory(24), max_model_len=fits)
    # two nodes of their own: the ranks split the model, each node holds half
    parallel_plan.plan(f, pp=2, cpu=cpu(16, nodes=2), memory=node_memory(11), max_model_len=8192)
    with pytest.raises(LayoutError, match="more ranks, so that each NUMA node holds"):
        parallel_plan.plan(f, cpu=cpu(16, nodes=2), memory=node_memory(11), max_model_len=8192)


def test_user_thread_layout_checks_the_shape_only():
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0|0|1|1"}
    assert parallel_plan.refuse(facts(SMOLLM2), 1, 4, cpu=cpu(2), environ=env) is None
    with pytest.raises(LayoutError, match="9 attention heads"):
        parallel_plan.refuse(facts(SMOLLM2), 2, 1, cpu=cpu(2), environ=env)


def _write_safetensors(path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header, offset = {}, 0
    sizes = {"BF16": 2, "F32": 4, "I32": 4}
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)


def test_weights_come_from_the_safetensors_headers(tmp_path):
    cfg = {**SMOLLM2, "num_hidden_layers": 2, "vocab_size": 100, "hidden_size": 8}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _write_safetensors(
        tmp_path / "model.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [100, 8]),
            "model.layers.0.mlp.up_proj.weight": ("BF16", [16, 8]),
            "model.layers.1.mlp.up_proj.weight": ("BF16", [16, 8]),
            "model.layers.1.input_layernorm.weight": ("BF16", [8]),
            "model.norm.weight": ("BF16", [8]),
        },
    )
    f = parallel_plan.model_facts(tmp_path)
    assert f.name == tmp_path.name
    assert (f.embed_bytes, f.layer_bytes, f.other_bytes) == (1600, (256, 272), 16)
    assert f.tied_embeddings and f.lm_head_bytes == 0
    assert parallel_plan.model_facts(tmp_path, dtype="float32").layer_bytes == (512, 544)
    # INT8 while loading: the 2-D layer weights to a byte each (with their scales)
    q = parallel_plan.model_facts(tmp_path, quantization="x86_int8")
    assert q.layer_bytes[0] == int(128 * (1 + 4 / 1024))
    assert q.embed_bytes == 1600


# ----------------------------------------------------------------------------- CLI


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_doctor_shows_the_plan_per_rank(default_model):
    p = cli("doctor", "--pp", "2", "--model", str(default_model))
    assert p.returncode == 0, p.stderr
    assert "tensor parallel 1 x pipeline parallel 2 = 2 rank(s)" in p.stdout
    rows = [line.split() for line in p.stdout.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert [r[:3] for r in rows] == [["0", "0", "0"], ["1", "0", "1"]]
    assert "0-14" in rows[0] and "15-29" in rows[1]
    assert "LM head (a copy of the tied embedding)" in p.stdout
    p = cli("doctor", "--json", "--pp", "2", "--model", str(default_model))
    plan = json.loads(p.stdout)["plan"]
    assert [r["layers"] for r in plan["ranks"]] == [[0, 15], [15, 30]]
    assert plan["ranks"][0]["kv_bytes"] > 0


def test_doctor_refuses_a_layout_with_the_sentence(default_model):
    p = cli("doctor", "--tp", "2", "--model", str(default_model))
    assert p.returncode == 1
    assert (
        f"{default_model.name} has 9 attention heads: --tensor-parallel-size 2 does not "
        "divide them; use --pipeline-parallel-size 2, or a tensor parallel size of 1"
    ) in p.stderr
    assert "Traceback" not in p.stderr
    p = cli("doctor", "--json", "--tp", "2", "--model", str(default_model))
    assert p.returncode == 1
    got = json.loads(p.stdout)
    assert got["ok"] is False and "9 attention heads" in got["error"]


def test_serve_refuses_tensor_parallel_2_before_anything_starts(default_model):
    from vllm_x86.tools.ports import free_port

    port = free_port()
    p = cli(
        "serve", str(default_model), "--tensor-parallel-size", "2", "--no-daemon",
        "--port", str(port),
    )  # fmt: skip
    assert p.returncode == 1
    assert (
        f"vllm-x86: error: {default_model.name} has 9 attention heads: "
        "--tensor-parallel-size 2 does not divide them; use --pipeline-parallel-size 2"
    ) in p.stderr
    assert "Traceback" not in p.stderr
    assert "vllm-x86: serving" not in p.stderr and "INFO" not in p.stderr  # no vLLM started
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens


@pytest.mark.slow  # a fresh interpreter importing vLLM
def test_the_platform_refuses_for_vllms_own_entry_points(default_model):
    """vLLM's LLM class and `vllm serve` build their config through the platform's
    check_and_update_config, which refuses with the same sentence. (vLLM checks the
    attention heads against TP itself, before the platform: that case shows vLLM's
    message there.)"""
    code = (
        "from vllm.engine.arg_utils import EngineArgs\n"
        "try:\n"
        f"    EngineArgs(model={str(default_model)!r}, enforce_eager=True,\n"
        "               pipeline_parallel_size=31).create_engine_config()\n"
        "except ValueError as e:\n"
        "    print('REFUSED', e)\n"
    )
    p = subprocess.run(
        [PYTHON, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=300
    )
    assert (
        f"{default_model.name} has 30 layers: --pipeline-parallel-size 31 leaves ranks "
        "without a layer; use a pipeline parallel size of at most"
    ) in p.stdout, p.stdout + p.stderr[-3000:]
