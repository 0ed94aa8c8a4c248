"""The input embedding read from the checkpoint file, row by row, instead of held in memory.

A decode step reads one row of the input embedding per token; the table itself is large
(Qwen2.5-Coder-0.5B: 151,936 x 896 bf16, 272 MB, more than its INT4 decoder layers) and,
where the LM head does not compute with it (an untied head, or a head quantized to
INT8/INT4), nothing else reads it. vLLM copies it into the engine's memory all the same,
where it counts in the server's resident and proportional memory for as long as it
serves. Here such a table stays in its safetensors file: the module's weight becomes an
empty tensor, and a lookup reads each token's row with ``pread`` into the output (the
file's pages sit in the page cache: shared, and reclaimable under memory pressure, at the
price of a read from disk for a row that was evicted).

Why ``pread`` and not a memory map of the file: a mapped page counts in the process's
memory once touched, and the kernel maps pages around each fault (fault-around and the
page cache's large folios): touching 64 rows 1 MiB apart in a mapping of this file mapped
9.6 MiB, about 150 KiB per row (Linux 6.18, the development VM), so a served
conversation would soon map most of the table again. Written here, in PyTorch and the
standard library, because no library reads rows of a safetensors tensor by offset.

When: the op table's module row for vLLM's ``VocabParallelEmbedding`` (exact class; the
LM head is a subclass and is not switched) switches an embedding with one
tensor-parallel rank and a float table; after the model is loaded, ``attach`` drops the
oneDNN GEMM vLLM CPU prepares for every embedding (a reordered copy of the table, as large
again; only an LM head runs it, and the model has one of its own: else nothing here
changes), and gives the module its table's file when every other module holding its weight is an LM head that computes from its own
INT8/INT4 copy, no LoRA or speculative decoding shares the model's modules, and a tensor
of the checkpoint's safetensors files has the table's dtype and shape and the same bytes
(compared in full, in chunks). Otherwise the table stays in memory and the op looks up the
module's weight as vLLM does, so a compiled graph is the same either way.
``VLLM_X86_FILE_EMBEDDING=0`` keeps every table in memory.

Do not change a checkpoint file in place while a server reads it (a file truncated under
a reader makes the read fail with an error naming the file); the plugin's own writers
(``pull``, ``quantize``) write a new file and rename it, which leaves the open file whole.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_x86.runtime import envs
from vllm_x86.runtime.log import get_logger

logger = get_logger("ops")

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


@dataclass
class FileTable:
    path: str
    fd: int
    offset: int  # of row 0 in the file
    rows: int
    row_bytes: int


# table name (the module's prefix) -> its file; per process (opened after the fork)
_TABLES: dict[str, FileTable] = {}


def file_embedding(ids: torch.Tensor, weight: torch.Tensor, table: str) -> torch.Tensor:
    """torch.ops.vllm_x86.file_embedding: ``F.embedding(ids, weight)`` when the module
    holds its table, else rows `ids` of the table named, read from its file. Opaque to
    torch.compile (ops/schemas.py gives the output's shape). The weight decides, not the
    name, which a compiled graph holds as a constant: a module that kept its table in
    memory never reads another's file."""
    if weight.shape[0] > 0:
        return torch.nn.functional.embedding(ids, weight)
    ft = _TABLES.get(table)
    if ft is None:
        raise RuntimeError(f"the input embedding {table!r} has neither rows nor a file")
    out = torch.empty((*ids.shape, weight.shape[1]), dtype=weight.dtype)
    if out.numel() == 0:
        return out
    raw = memoryview(out.view(-1).view(torch.uint8).numpy()).cast("B")
    rb, base, fd = ft.row_bytes, ft.offset, ft.fd
    for i, row in enumerate(ids.reshape(-1).tolist()):
        if not 0 <= row < ft.rows:
            raise IndexError(f"index {row} is out of range of the embedding ({ft.rows} rows)")
        got = os.preadv(fd, [raw[i * rb : (i + 1) * rb]], base + row * rb)
        if got != rb:
            raise RuntimeError(
                f"the input embedding's row {row} could not be read from {ft.path} "
                f"({got} of {rb} bytes): was the checkpoint file changed while serving?"
            )
    return out


torch.library.impl("vllm_x86::file_embedding", "CPU")(file_embedding)


def eligible(module) -> str | None:
    """The op table's check: None if `module` may read its table from a file, else why
    not. The file itself is found after loading (``attach``)."""
    if not envs.get_bool("VLLM_X86_FILE_EMBEDDING"):
        return "VLLM_X86_FILE_EMBEDDING=0"
    if getattr(module, "tp_size", 1) != 1:
        return "tensor parallelism (each rank holds a shard)"
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    if type(getattr(module, "quant_method", None)) is not UnquantizedEmbeddingMethod:
        return "a quantized embedding"
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype not in _DTYPES.values():
        return "not a float table"
    return None


class X86FileEmbeddingMixin:
    """vLLM's VocabParallelEmbedding whose lookups go through
    ``torch.ops.vllm_x86.file_embedding`` (see the module docstring)."""

    def forward(self, input_):
        return torch.ops.vllm_x86.file_embedding(
            input_.long(), self.weight, getattr(self, "x86_table_name", "")
        )


def _safetensors_tensors(path: Path):
    """(name, dtype, shape, file offset of the data) of every tensor in a safetensors
    file."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    for name, info in header.items():
        if name == "__metadata__" or info.get("dtype") not in _DTYPES:
            continue
        yield name, _DTYPES[info["dtype"]], tuple(info["shape"]), 8 + n + info["data_offsets"][0]


def _same_bytes(fd: int, offset: int, w: torch.Tensor, chunk: int = 8 << 20) -> bool:
    """Whether the file holds exactly `w`'s bytes at `offset` (read in chunks)."""
    flat = w.detach().contiguous().view(-1).view(torch.uint8)
    buf = torch.empty(min(chunk, flat.numel()), dtype=torch.uint8)
    view = memoryview(buf.numpy()).cast("B")
    done = 0
    while done < flat.numel():
        n = min(chunk, flat.numel() - done)
        if os.preadv(fd, [view[:n]], offset + done) != n:
            return False
        if not torch.equal(buf[:n], flat[done : done + n]):
            return False
        done += n
    return True


def _find(model_dir: Path, w: torch.Tensor, prefix: str) -> FileTable | None:
    """The checkpoint tensor that holds `w`'s bytes: candidates of the same dtype and
    shape, the ones named like the module first."""
    files = sorted(model_dir.glob("*.safetensors"))
    candidates = []
    for path in files:
        try:
            tensors = list(_safetensors_tensors(path))
        except (OSError, ValueError, KeyError, struct.error):
            continue
        for name, dtype, shape, offset in tensors:
            if dtype == w.dtype and shape == tuple(w.shape):
                candidates.append(
                    (not name.endswith(prefix.split(".")[-1] + ".weight"), path, offset)
                )
    for _, path, offset in sorted(candidates, key=lambda c: c[0]):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if _same_bytes(fd, offset, w):
            return FileTable(str(path), fd, offset, w.shape[0], w.shape[1] * w.element_size())
        os.close(fd)
    return None


def _heads_with_own_copy(model) -> set[int]:
    """ids of the LM heads that compute from their own INT8/INT4 copy and never read
    their float weight (quant/lm_head.py sets ``x86_lm_head`` on those)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    return {
        id(mod)
        for mod in model.modules()
        if isinstance(mod, ParallelLMHead) and getattr(mod, "x86_lm_head", False) is True
    }


def attach(model, vllm_config) -> int:
    """Give each switched embedding of `model` its table's file where it can (see the
    module docstring) and free the table's memory; the bytes freed."""
    switched = [
        (name, mod) for name, mod in model.named_modules() if isinstance(mod, X86FileEmbeddingMixin)
    ]
    if not switched:
        return 0

    def keep(name, why):
        logger.info("vllm-x86: the input embedding %s stays in memory: %s", name, why)

    model_dir = Path(str(vllm_config.model_config.model))
    shared = (
        "speculative decoding"
        if getattr(vllm_config, "speculative_config", None) is not None
        else "LoRA"
        if getattr(vllm_config, "lora_config", None) is not None
        else None
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    has_head = any(isinstance(m, ParallelLMHead) for m in model.modules())
    own_copy = _heads_with_own_copy(model)
    freed = 0
    for name, mod in switched:
        mod.x86_table_name = name
        w = mod.weight
        if not has_head:
            keep(name, "the model has no LM head of its own and may compute with it")
            continue
        # vLLM CPU prepares a oneDNN GEMM (a reordered copy of the table) for every
        # embedding; only an LM head runs it, and this module is not the head: a tied
        # head has its own (tied_embedding_gemm shares one between them), a quantized
        # head none
        if getattr(mod, "cpu_linear", None) is not None:
            from vllm_x86.runtime.patches import tied_embedding_gemm

            del mod.cpu_linear
            tied_embedding_gemm.forget(w)
        if shared:
            keep(name, f"{shared} may read its weight")
            continue
        table = w.untyped_storage().data_ptr()
        readers = [
            other
            for other in model.modules()
            if other is not mod
            and id(other) not in own_copy
            and any(
                p.numel() and p.untyped_storage().data_ptr() == table
                for p in other.parameters(recurse=False)
            )
        ]
        if readers:
            keep(name, f"{type(readers[0]).__name__} computes with the same weight")
            continue
        if name in _TABLES:
            keep(name, "another model in this process reads a table of that name")
            continue
        if not model_dir.is_dir():
            keep(name, "the model is not a local directory")
            continue
        ft = _find(model_dir, w, name)
        if ft is None:
            keep(name, "no safetensors tensor of the checkpoint holds the same bytes")
            continue
        _TABLES[name] = ft
        size = w.numel() * w.element_size()
        freed += size
        w.data = w.data.new_empty((0, w.shape[1]))
        logger.info(
            "vllm-x86: the input embedding %s (%d x %d, %.0f MiB) is read by row from %s "
            "instead of held in memory (VLLM_X86_FILE_EMBEDDING=0 keeps it)",
            name,
            ft.rows,
            w.shape[1],
            size / 2**20,
            Path(ft.path).name,
        )
    return freed
