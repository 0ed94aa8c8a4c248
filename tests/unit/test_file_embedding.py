"""The input embedding read by row from the checkpoint file (ops/file_embedding.py): the
op gives F.embedding's rows, the table's memory goes, and every case where something may
still compute with the table keeps it in memory."""

from __future__ import annotations

import os
import types

import pytest
import torch
from safetensors.torch import save_file

from vllm_x86.runtime.ops import file_embedding as fe


@pytest.fixture(autouse=True)
def _clean_tables():
    yield
    for ft in fe._TABLES.values():
        os.close(ft.fd)
    fe._TABLES.clear()


class Embedding(fe.X86FileEmbeddingMixin, torch.nn.Module):
    """A switched input embedding, as the op table leaves vLLM's module."""

    def __init__(self, weight: torch.nn.Parameter):
        super().__init__()
        self.weight = weight
        self.cpu_linear = lambda x, w, b: x @ w.t()  # what vLLM CPU prepares


def _head(weight: torch.nn.Parameter, quantized: bool):
    """A ParallelLMHead without vLLM's distributed set-up: quantized, it computes from
    its own copy (quant/lm_head.py), else from `weight`."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    from vllm_x86.runtime.quant.lm_head import X86LMHeadMethod

    head = object.__new__(ParallelLMHead)
    torch.nn.Module.__init__(head)
    head.weight = weight
    if quantized:
        head.quant_method = X86LMHeadMethod(bits=8)
        head.x86_lm_head = True
    return head


def _model(embedding, head=None):
    model = torch.nn.Module()
    model.embed_tokens = embedding
    if head is not None:
        model.lm_head = head
    return model


def _config(model_dir, **extra):
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(model=str(model_dir)),
        speculative_config=extra.get("speculative_config"),
        lora_config=extra.get("lora_config"),
    )


@pytest.fixture
def checkpoint(tmp_path):
    """A safetensors file with an untied head and embedding of the same shape, the
    embedding second (the op must find it by its bytes, not its place)."""
    torch.manual_seed(0)
    table = torch.randn(300, 64).to(torch.bfloat16)
    save_file(
        {
            "lm_head.weight": torch.randn(300, 64).to(torch.bfloat16),
            "model.embed_tokens.weight": table,
            "model.norm.weight": torch.ones(64, dtype=torch.bfloat16),
        },
        str(tmp_path / "model.safetensors"),
    )
    return tmp_path, table


def _param(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t.clone(), requires_grad=False)


def test_untied_table_is_read_from_the_file_with_the_same_rows(checkpoint):
    model_dir, table = checkpoint
    emb = Embedding(_param(table))
    head = _head(_param(torch.randn(300, 64).to(torch.bfloat16)), quantized=False)
    freed = fe.attach(_model(emb, head), _config(model_dir))
    assert freed == table.numel() * 2
    assert emb.weight.shape == (0, 64)  # the memory is gone
    assert not hasattr(emb, "cpu_linear")  # and vLLM CPU's GEMM copy of it
    ids = torch.tensor([[0, 299, 5, 5], [17, 42, 0, 298]])
    out = emb(ids)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, torch.nn.functional.embedding(ids, table))
    assert emb(torch.tensor([], dtype=torch.long)).shape == (0, 64)
    with pytest.raises(IndexError, match="index 300 is out of range"):
        emb(torch.tensor([1, 300]))


def test_tied_table_of_a_quantized_head_is_read_from_the_file(checkpoint):
    model_dir, table = checkpoint
    w = _param(table)
    emb = Embedding(w)
    head = _head(w, quantized=True)  # tie_weights: one Parameter
    assert fe.attach(_model(emb, head), _config(model_dir)) > 0
    ids = torch.tensor([3, 1, 4, 1, 5])
    assert torch.equal(emb(ids), torch.nn.functional.embedding(ids, table))


@pytest.mark.parametrize(
    "case",
    ["tied unquantized head", "no head", "other bytes", "speculative decoding", "no file"],
)
def test_the_table_stays_in_memory_where_something_may_read_it(checkpoint, case, tmp_path):
    model_dir, table = checkpoint
    w = _param(table)
    emb = Embedding(w)
    head = _head(w if case == "tied unquantized head" else _param(table * 2), quantized=False)
    config = _config(model_dir)
    if case == "no head":
        head = None
    elif case == "other bytes":
        w.data[7, 3] += 1  # what the loader left differs from every tensor of the file
    elif case == "speculative decoding":
        config = _config(model_dir, speculative_config=object())
    elif case == "no file":
        config = _config(tmp_path / "elsewhere")
    before = w.detach().clone()
    assert fe.attach(_model(emb, head), config) == 0
    assert torch.equal(emb.weight, before)  # nothing freed
    ids = torch.tensor([7, 0, 299])
    assert torch.equal(emb(ids), torch.nn.functional.embedding(ids, before))


def test_a_second_model_in_the_process_keeps_its_own_table(checkpoint, tmp_path):
    """Two models with the same module names in one process: the second keeps its table
    in memory, and its lookups read that table, not the first model's file."""
    model_dir, table = checkpoint
    first = Embedding(_param(table))
    fe.attach(_model(first, _head(_param(table * 2), quantized=False)), _config(model_dir))
    other = (table.float() + 1).to(torch.bfloat16)
    second = Embedding(_param(other))
    assert (
        fe.attach(_model(second, _head(_param(other * 2), quantized=False)), _config(model_dir))
        == 0
    )
    ids = torch.tensor([4, 2])
    assert torch.equal(second(ids), torch.nn.functional.embedding(ids, other))
    assert torch.equal(first(ids), torch.nn.functional.embedding(ids, table))


def test_a_file_changed_under_the_server_is_an_error_naming_it(checkpoint):
    model_dir, table = checkpoint
    emb = Embedding(_param(table))
    fe.attach(_model(emb, _head(_param(table * 2), quantized=False)), _config(model_dir))
    path = model_dir / "model.safetensors"
    os.truncate(path, os.path.getsize(path) - table.numel())  # the embedding's end is gone
    with pytest.raises(RuntimeError, match="could not be read from .*model.safetensors"):
        emb(torch.tensor([299]))


def test_the_op_traces_through_torch_compile(checkpoint):
    """The graph holds the op (its fake gives the output's shape): the same result from
    a compiled function, for a table read from the file."""
    model_dir, table = checkpoint
    emb = Embedding(_param(table))
    fe.attach(_model(emb, _head(_param(table * 2), quantized=False)), _config(model_dir))
    f = torch.compile(lambda ids: emb(ids).float() * 2, backend="eager", fullgraph=True)
    ids = torch.tensor([9, 8, 7])
    assert torch.equal(f(ids), torch.nn.functional.embedding(ids, table).float() * 2)
