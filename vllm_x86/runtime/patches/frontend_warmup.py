"""Patch ``frontend_warmup_during_engine_start`` (a monkey-patch; ledger.py).

vLLM's OpenAI server builds its renderer before it starts the engine process
(``AsyncLLM.__init__``, ``v1/engine/async_llm.py``), and ``HfRenderer.__init__``
(``renderers/hf.py``) makes ``renderer_num_workers + 1`` deep copies of the tokenizer
there for a thread pool (``maybe_make_thread_pool`` in ``tokenizers/hf.py``): about
0.7 s each for Qwen3's 151k-token tokenizer on the development VM (a Python deep copy
plus a round trip of the Rust tokenizer through JSON). After the engine is ready, the
server's renderer warm-up (``BaseRenderer.warmup``) resolves the chat template, which
first asks ``AutoProcessor`` for one: for a text-only model that loads the whole
tokenizer again (about 1.2 s) to learn there is none. Both sit on the start's critical
path while the CPU waits for the engine, or the engine waits for them. vLLM already has
the hook to overlap frontend work with the engine start: right after it has forked the
engine-core process, the client calls the renderer's ``start_mm_warmup_in_background``,
which submits the multimodal warm-up to the renderer's single-thread ``_mm_executor``
("must not run while fork() is in flight", vLLM's comment in ``core_client.py``).

The patch, only in the plugin's own servers (``VLLM_X86_SERVE_DEFAULTS=1``, which
`vllm-x86 serve` and the daemon set; the OpenAI server always runs the renderer warm-up
before it serves) and unless ``VLLM_X86_FRONTEND_WARMUP=0``: (1) the renderer module's
``maybe_make_thread_pool`` builds vLLM's ``TokenizerPool`` with no copies yet and
remembers how many it owes; (2) ``start_mm_warmup_in_background`` runs vLLM's method and
then submits, to the same executor, a task that puts those copies into vLLM's pool
(``copy.deepcopy`` of vLLM's own ``og_tokenizer``, as its loop would) and calls vLLM's
``_try_get_processor_chat_template`` with the arguments ``resolve_chat_template``
passes, which fills vLLM's own ``_PROCESSOR_CHAT_TEMPLATES`` cache; where the model's
files rule a processor out (``no_processor_possible``: a local directory without any of
the files or entries that make ``AutoProcessor`` return a processor, following its
code), the task writes vLLM's answer for that case, None, into the cache instead of
loading the tokenizer a third time; (3) ``BaseRenderer.warmup`` waits for that task
before it runs vLLM's warm-up, so the server never serves a request before the copies
exist, and the chat template is resolved exactly as before (from the filled cache).
Nothing vLLM computes changes, only when: the same copies of the same tokenizer, the
same template. The task then gives the heap pages the copies freed back to the system
(``heap.py``). The pool and its ``og_tokenizer`` are found through the closure of vLLM's
``TokenizerPool`` methods; where a vLLM version builds its pool otherwise, the patch is
not installed for the pool (a warning says so) and vLLM makes its copies up front as
before. If the task fails, its error is logged and the server goes on: vLLM's pool makes
a copy on demand when it has none, and the warm-up looks the template up again.

Upstream change that removes it: vLLM starting the engine before it builds the
renderer, or making the pool's copies in its background warm-up. It can go when the
pinned vLLM does either.
"""

from __future__ import annotations

import copy
import os
import time
import weakref

from vllm_x86.runtime import envs
from vllm_x86.runtime.log import get_logger
from vllm_x86.runtime.patches.ledger import MARK

logger = get_logger("patches")

# pooled tokenizer -> (vLLM's pool queue, its og_tokenizer, copies owed); held weakly,
# so an entry never outlives its tokenizer (nor meets another at the same address)
_OWED_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def enabled() -> bool:
    """In the plugin's own servers (VLLM_X86_SERVE_DEFAULTS, set by `vllm-x86 serve`
    and the daemon), unless VLLM_X86_FRONTEND_WARMUP=0."""
    return envs.serve_defaults() and envs.get_bool("VLLM_X86_FRONTEND_WARMUP")


def _closure_vars(fn) -> dict:
    fn = getattr(fn, "__wrapped__", fn)
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or cells is None:
        return {}
    out = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    return out


def tokenizer_pool_of(pooled) -> tuple | None:
    """(queue, og_tokenizer) of the pool vLLM's ``maybe_make_thread_pool`` built into
    ``pooled``'s class, or None where that class is not such a pool."""
    import queue

    method = vars(type(pooled)).get("encode")
    borrow = _closure_vars(method).get("_borrow_from_pool") if method else None
    found = _closure_vars(borrow) if borrow else {}
    pool, og = found.get("tokenizer_pool"), found.get("og_tokenizer")
    if isinstance(pool, queue.Queue) and og is not None:
        return pool, og
    return None


def _pool_builder_known(make_pool) -> bool:
    code = getattr(make_pool, "__code__", None)
    return code is not None and {"tokenizer_pool", "og_tokenizer", "_borrow_from_pool"} <= set(
        code.co_cellvars
    )


def apply() -> None:
    """Install the three replacements (idempotent; see the module docstring)."""
    from vllm.renderers import base as renderer_base
    from vllm.renderers import hf as renderer_hf

    cls = renderer_base.BaseRenderer
    if getattr(cls.start_mm_warmup_in_background, MARK, False):
        return
    if "_mm_executor" not in cls.__init__.__code__.co_names:
        logger.warning(
            "vllm-x86: this vLLM's renderer has no _mm_executor; the tokenizer copies "
            "and chat-template lookup stay before the engine start"
        )
        return
    original_start = cls.start_mm_warmup_in_background
    original_warmup = cls.warmup
    original_make_pool = renderer_hf.maybe_make_thread_pool

    def start_mm_warmup_in_background(self) -> None:
        original_start(self)
        if not enabled() or getattr(self, "_vllm_x86_frontend", None):
            return
        self._vllm_x86_frontend = self._mm_executor.submit(frontend_work, self)

    def warmup(self, chat_params) -> None:
        future = getattr(self, "_vllm_x86_frontend", None)
        if future is not None:
            future.result()  # frontend_work logs its own errors and returns
        return original_warmup(self, chat_params)

    def maybe_make_thread_pool(tokenizer, copies: int = 1):
        if not enabled() or copies <= 0:
            return original_make_pool(tokenizer, copies)
        pooled = original_make_pool(tokenizer, 0)
        found = tokenizer_pool_of(pooled)
        if found is None:  # not a pool (e.g. a slow tokenizer): nothing owed
            return pooled
        try:
            _OWED_COPIES[pooled] = (*found, copies)
        except TypeError:  # a tokenizer that cannot be referenced weakly: copies now
            pool, og = found
            for _ in range(copies):
                pool.put(copy.deepcopy(og))
        return pooled

    for fn in (start_mm_warmup_in_background, warmup, maybe_make_thread_pool):
        setattr(fn, MARK, True)
    cls.start_mm_warmup_in_background = start_mm_warmup_in_background
    cls.warmup = warmup
    if _pool_builder_known(original_make_pool):
        renderer_hf.maybe_make_thread_pool = maybe_make_thread_pool
    else:
        logger.warning(
            "vllm-x86: this vLLM builds its tokenizer pool differently; its copies "
            "stay before the engine start (runtime/patches/frontend_warmup.py)"
        )


def frontend_work(renderer) -> None:
    """The tokenizer copies vLLM's pool is owed and the processor chat-template
    lookup, on the renderer's executor while the engine process loads the model."""
    from vllm.renderers import hf as renderer_hf

    t0 = time.perf_counter()
    done = []
    try:
        tokenizer = renderer.tokenizer
        owed = _OWED_COPIES.pop(tokenizer, None) if tokenizer is not None else None
        if owed is not None:
            pool, og, copies = owed
            for _ in range(copies):
                pool.put(copy.deepcopy(og))  # what vLLM's maybe_make_thread_pool does
            done.append(f"{copies} tokenizer copies")
            # a copy goes through a JSON round trip of the Rust tokenizer, whose
            # temporaries glibc keeps: about 110 of the 230 MiB two copies of Qwen2.5's
            # tokenizer leave resident (heap.py)
            from vllm_x86.runtime import heap

            heap.return_freed_memory("after the tokenizer copies")
        lookup = getattr(renderer_hf, "_try_get_processor_chat_template", None)
        if isinstance(renderer, renderer_hf.HfRenderer) and tokenizer is not None and lookup:
            mc = renderer.model_config
            # the arguments resolve_chat_template passes, and vLLM's cache key of them
            revision = mc.tokenizer_revision
            code_revision = mc.code_revision if mc.tokenizer == mc.model else None
            key = (tokenizer.name_or_path, revision, code_revision, mc.trust_remote_code)
            cache = getattr(renderer_hf, "_PROCESSOR_CHAT_TEMPLATES", None)
            if isinstance(cache, dict) and no_processor_possible(
                tokenizer.name_or_path, mc.trust_remote_code
            ):
                cache.setdefault(key, None)
                done.append("processor chat-template lookup (no processor files)")
            else:
                lookup(
                    tokenizer,
                    revision=revision,
                    code_revision=code_revision,
                    trust_remote_code=mc.trust_remote_code,
                )
                done.append("processor chat-template lookup")
    except Exception as e:  # the server still starts: vLLM does this work on demand
        logger.warning(
            "vllm-x86: tokenizer warm-up beside the engine start failed (%s: %s); vLLM "
            "makes tokenizer copies on demand and looks the chat template up again",
            type(e).__name__,
            e,
        )
        return
    if done:
        logger.info(
            "vllm-x86: %s done beside the engine start in %.2f s",
            " and ".join(done),
            time.perf_counter() - t0,
        )


def no_processor_possible(path: str, trust_remote_code: bool) -> bool:
    """True when transformers' ``AutoProcessor.from_pretrained(path)`` cannot return a
    ``ProcessorMixin`` (so vLLM's processor chat template is None), decided from the
    files alone, following that function (models/auto/processing_auto.py): a local
    directory with no processor, image-, video- or feature-extractor config file, no
    ``processor_class`` or ``AutoProcessor`` entry in tokenizer_config.json or the
    model config, and a config class without a processor in ``PROCESSOR_MAPPING``.
    Then AutoProcessor falls back to AutoTokenizer (and the image, video and feature
    classes), none of them a processor: loading the tokenizer again only to learn
    that is what this saves. Anything else (a hub name, remote code, any of those
    files or entries, an unreadable file) answers False: ask transformers."""
    import json
    from pathlib import Path

    if trust_remote_code or not os.path.isdir(path):
        return False
    try:
        from transformers import AutoConfig
        from transformers.models.auto import processing_auto as pa

        for name in (pa.PROCESSOR_NAME, pa.FEATURE_EXTRACTOR_NAME, pa.VIDEO_PROCESSOR_NAME):
            if (Path(path) / name).exists():
                return False
        tok_config = Path(path) / pa.TOKENIZER_CONFIG_FILE
        if tok_config.exists():
            d = json.loads(tok_config.read_text(encoding="utf-8"))
            if d.get("processor_class") is not None or "AutoProcessor" in d.get("auto_map", {}):
                return False
        config = AutoConfig.from_pretrained(path)
        if getattr(config, "processor_class", None) is not None:
            return False
        if "AutoProcessor" in (getattr(config, "auto_map", None) or {}):
            return False
        return type(config) not in pa.PROCESSOR_MAPPING
    except Exception:  # whatever it is, transformers decides
        return False
