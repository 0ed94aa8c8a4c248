"""``python -m vllm_x86.runtime.patches``: the ledger as markdown, ``--check`` against the
installed packages, ``--write docs/patches.md`` (ledger.py)."""

from __future__ import annotations

from vllm_x86.runtime.patches.ledger import main

if __name__ == "__main__":
    raise SystemExit(main())
