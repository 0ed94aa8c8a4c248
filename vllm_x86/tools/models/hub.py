"""A hub id (``org/name``) means that model, read from the local Hugging Face cache.

`vllm-x86 serve Qwen/Qwen2.5-0.5B-Instruct` serves exactly that hub model: the snapshot
the local Hugging Face cache holds for it (HF_HUB_CACHE, else HF_HOME/hub, else
~/.cache/huggingface/hub: huggingface_hub's own order), looked up without the network.
vllm-x86 never downloads from the hub (the machines it is made for often cannot reach
it, and stock vLLM would stop there with a traceback or wait on the network), so an id
that is not in the cache is an error that says how to get it, before vLLM starts. It
names the catalog entry built from that model when there is one: a catalog entry has its
own name, never the hub id, because its weights are not the hub model's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# huggingface_hub's rule for a repo id: one optional "org/", names of letters, digits,
# '-', '_' and '.', not starting or ending with '-' or '.', at most 96 characters
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"(?:{_PART}/)?{_PART}")


class HubCacheError(RuntimeError):
    """A hub id that the local cache cannot serve; the message is meant for the user.
    `missing`: the cache has no snapshot of it at all."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def is_repo_id(arg: str) -> bool:
    """Whether `arg` has the form of a hub id ("org/name" or a legacy "name")."""
    return bool(_REPO_ID.fullmatch(arg)) and "--" not in arg and ".." not in arg


def hf_cache_dir() -> Path:
    """The hub cache folder, read from the environment now (huggingface_hub reads it
    once, when it is imported)."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    hub = (
        os.environ.get("HF_HUB_CACHE")
        or os.environ.get("HUGGINGFACE_HUB_CACHE")
        or os.path.join(home, "hub")
    )
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def _shown(path: Path) -> str:
    home = os.path.expanduser("~")
    text = str(path)
    return "~" + text[len(home) :] if home != "/" and text.startswith(home + os.sep) else text


def cached_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot directory of hub model `repo_id` (its config.json inside).

    Raises HubCacheError when the cache does not have it, naming the catalog build of
    the same model if the catalog has one."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = hf_cache_dir()
    rev = f" at revision {revision}" if revision else ""
    try:
        path = Path(
            snapshot_download(
                repo_id, revision=revision, cache_dir=str(cache), local_files_only=True
            )
        )
    except HFValidationError as e:
        raise HubCacheError(f"'{repo_id}' is not a valid hub id: {e}") from None
    except LocalEntryNotFoundError:
        raise HubCacheError(
            f"{repo_id}{rev} is not in the local Hugging Face cache ({_shown(cache)}), and "
            "vllm-x86 does not download from the hub. Download it on a machine that can "
            f"reach the hub (`hf download {repo_id}`) and copy the cache folder here (or "
            "point HF_HUB_CACHE at it), or give a local model directory. " + catalog_hint(repo_id),
            missing=True,
        ) from None
    if not (path / "config.json").is_file():
        raise HubCacheError(
            f"the local Hugging Face cache has {repo_id}{rev} ({path}) but without "
            f"config.json: an incomplete download. Run `hf download {repo_id}` again where "
            "the hub can be reached."
        )
    return path


def catalog_hint(repo_id: str) -> str:
    """The sentence that points from a hub id to the catalog entries built from it."""
    from vllm_x86.tools.models.catalog import builds_of

    builds = builds_of(repo_id)
    if not builds:
        return "Models vllm-x86 can fetch without the hub: `vllm-x86 pull --list`."
    m = builds[0]
    return (
        f"The catalog has a {m.weights_summary} build of it, dequantized to bf16 (close to "
        f"the original weights, not equal): `vllm-x86 serve {m.name}` (all catalog models: "
        "`vllm-x86 pull --list`)."
    )
