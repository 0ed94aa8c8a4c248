"""What every contender is asked to do, and the figures measured.

Prompts are fixed texts turned into token ids once, with the model's own tokenizer, and
sent as token ids: every contender gets exactly the same input, whatever its tokenizer.
Each request is greedy (temperature 0) and ignores end-of-sequence, so it produces
exactly ``new_tokens`` tokens.

Figures (one value per contender per round):

- ``decode_C_tok_s``: C concurrent requests of ``new_tokens`` tokens from short prompts
  (prompts 0..C-1); completion tokens of all of them ÷ wall time from sending the first
  to receiving the last token;
- ``ttft_s``: time to first token of a ``prompt_tokens``-token prompt, alone on the
  engine (median of ``ttft_samples`` distinct prompts, so no prefix cache can answer);
- ``prefill_tok_s``: ``prompt_tokens`` ÷ ``ttft_s``;
- ``startup_s``: from launching the contender's process to the first token of its first
  request (a 1-token request sent as soon as the contender can take it);
- ``peak_rss_mib``: peak RSS of the contender's process tree, each process's own peak
  added up; ``peak_pss_mib``: the largest sum of PSS sampled, which counts pages the
  processes share once (``proctree`` says how both are read); ``kv_resident_mib``: the
  most of the KV cache's pages seen resident, and ``peak_pss_less_kv_mib``: the PSS sum
  less them (the plugin's servers, which log where their cache lies);
- ``roofline_pct``: ``decode_1_tok_s`` as a percentage of the decode roofline (see
  ``roofline``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

DECODE_PROMPT = "Tell me a long story about the number {i}."
# A plain, fixed text; repeated and cut to the TTFT prompt's length in tokens.
LONG_TEXT = (
    "The river starts high in the mountains, where snow melts into thin streams that run "
    "between grey stones. Farther down, the streams meet and the water grows wide and "
    "slow; villages stand on both banks, with mills, bridges and small gardens. Fishermen "
    "go out before sunrise and come back with baskets of silver fish, and the market in "
    "the main square opens at seven. Children walk to school along the old road, past "
    "the church, the bakery and the house with the blue door. "
)
TTFT_PROMPT_HEAD = "Document {k}. Read the following passage and summarise it.\n\n"
WARMUP_PROMPT = "Warm up the engine, please."


@dataclass(frozen=True)
class Workload:
    new_tokens: int = 128
    concurrency: tuple[int, ...] = (1, 8, 32)
    prompt_tokens: int = 512
    ttft_samples: int = 3
    max_model_len: int = 2048

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    higher_is_better: bool
    digits: int = 1


def figures(w: Workload) -> list[Figure]:
    out = [
        Figure(f"decode_{c}_tok_s", f"decode, {c} request{'s' if c > 1 else ''} (tok/s)", True)
        for c in w.concurrency
    ]
    out += [
        Figure("ttft_s", f"TTFT, {w.prompt_tokens}-token prompt (s)", False, 3),
        Figure("prefill_tok_s", "prefill (tok/s)", True, 0),
        Figure("startup_s", "start-up to first token (s)", False),
        Figure("peak_rss_mib", "peak RSS, process tree (MiB)", False, 0),
        Figure("peak_pss_mib", "peak PSS, process tree (MiB)", False, 0),
        Figure("peak_pss_less_kv_mib", "peak PSS less the KV cache's pages (MiB)", False, 0),
        Figure("kv_resident_mib", "KV cache resident, peak (MiB)", False, 0),
        Figure("roofline_pct", "decode, 1 request, % of roofline", True),
    ]
    return out


class PromptSet:
    """The workload's prompts as token ids, built with the model's tokenizer."""

    def __init__(self, model_dir: str | Path, w: Workload):
        self.w = w
        enc = _encoder(Path(model_dir))
        n = max(w.concurrency)
        self.decode = [enc(DECODE_PROMPT.format(i=i)) for i in range(n)]
        self.warmup = enc(WARMUP_PROMPT)
        self.warmup_batch = [enc(DECODE_PROMPT.format(i=1000 + i)) for i in range(8)]
        self.ttft = [self._long(enc, k) for k in range(w.ttft_samples)]
        # a long prompt for warm-up, distinct from the measured ones
        self.ttft_warmup = self._long(enc, w.ttft_samples + 100)

    def _long(self, enc, k: int) -> list[int]:
        text = TTFT_PROMPT_HEAD.format(k=k) + LONG_TEXT
        ids = enc(text)
        while len(ids) < self.w.prompt_tokens:
            text += LONG_TEXT
            ids = enc(text)
        return ids[: self.w.prompt_tokens]

    def to_json(self) -> dict:
        return {
            "decode": self.decode,
            "warmup": self.warmup,
            "warmup_batch": self.warmup_batch,
            "ttft": self.ttft,
            "ttft_warmup": self.ttft_warmup,
        }


def _encoder(model_dir: Path):
    tj = model_dir / "tokenizer.json"
    if tj.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tj))
        return lambda text: tok.encode(text, add_special_tokens=True).ids
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_dir))
    return lambda text: list(hf(text)["input_ids"])


def save_prompts(prompts: PromptSet, path: Path) -> None:
    path.write_text(json.dumps(prompts.to_json()))
