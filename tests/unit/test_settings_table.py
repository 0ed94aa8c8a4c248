"""Every VLLM_X86_* name in the source tree is a row of vllm_x86/runtime/envs.py's table,
and docs/configuration.md lists every user-facing row with its default."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from vllm_x86.runtime import envs

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"VLLM_X86_[A-Z0-9_]+")
TABLE = {s.name: s for s in envs.SETTINGS}
# docs/bench/ holds the records of past runs (their commands and environments as they
# were); history is not rewritten when a setting changes.
NOT_SCANNED = ("docs/bench/",)


def _source_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / f for f in out if not f.startswith(NOT_SCANNED) and (ROOT / f).is_file()]


def _names_in_tree() -> dict[str, list[str]]:
    """VLLM_X86_* name -> 'file:line' of each use, outside envs.py. A name that code
    uses as a prefix (``startswith("VLLM_X86_QUANT")``, or one ending in ``_``) is
    recorded as ``PREFIX*``."""
    found: dict[str, list[str]] = {}
    for path in _source_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel == "vllm_x86/runtime/envs.py":
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a binary file
        for i, line in enumerate(text.splitlines(), 1):
            for m in NAME.finditer(line):
                name = m.group()
                if name.endswith("_") or re.search(rf"startswith\([^)]*[\"']{name}[\"']", line):
                    name = name + "*"
                found.setdefault(name, []).append(f"{rel}:{i}")
    return found


def test_every_name_in_the_tree_is_in_the_table():
    unknown = {}
    for name, where in _names_in_tree().items():
        if name.endswith("*"):
            if not any(s.startswith(name[:-1]) for s in TABLE):
                unknown[name] = where
        elif name not in TABLE:
            unknown[name] = where
    assert not unknown, (
        "VLLM_X86_* names not in vllm_x86/runtime/envs.py's SETTINGS (add a row, internal "
        "if users never set it):\n  "
        + "\n  ".join(f"{n}: {', '.join(w[:3])}" for n, w in sorted(unknown.items()))
    )


def test_every_row_of_the_table_is_used():
    used = _names_in_tree()
    code = {
        n
        for n, where in used.items()
        if any(not w.startswith(("docs/", "README.md", "CONTRIBUTING.md")) for w in where)
    }
    stale = [n for n in TABLE if n not in code]
    assert not stale, f"settings in envs.py that no code reads or writes: {stale}"


def _documented() -> dict[str, str]:
    """`NAME` -> `default` of each row of configuration.md's settings table."""
    doc = (ROOT / "docs" / "configuration.md").read_text()
    rows = re.findall(r"^\| `(VLLM_X86_[A-Z0-9_]+)` \| `([^`]*)` \|", doc, flags=re.M)
    return dict(rows)


def test_configuration_md_lists_every_user_facing_setting_with_its_default():
    documented = _documented()
    user = {n: s.default for n, s in TABLE.items() if not s.internal}
    assert set(documented) == set(user), (
        f"docs/configuration.md's table lacks {sorted(set(user) - set(documented))} and "
        f"lists {sorted(set(documented) - set(user))}, which envs.py does not have as "
        "user-facing settings"
    )
    wrong = {n: (documented[n], d) for n, d in user.items() if documented[n] != d}
    assert not wrong, f"defaults in docs/configuration.md differ from envs.py: {wrong}"


def test_configuration_md_names_the_internal_variables():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    internal = [n for n, s in TABLE.items() if s.internal]
    assert internal
    missing = [n for n in internal if f"`{n}`" not in doc]
    assert not missing, f"docs/configuration.md does not mention {missing}"


def test_every_setting_has_a_meaning_and_unknown_names_are_refused():
    for s in envs.SETTINGS:
        assert s.meaning.strip(), s.name
    with pytest.raises(KeyError):
        envs.get("VLLM_X86_" + "NO_SUCH_SETTING")  # (split: the scan above would find it)


@pytest.mark.parametrize(
    "value, want", [(None, False), ("0", False), ("1", True), ("true", True), ("serve", False)]
)
def test_serve_defaults(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("VLLM_X86_SERVE_DEFAULTS", raising=False)
    else:
        monkeypatch.setenv("VLLM_X86_SERVE_DEFAULTS", value)
    assert envs.serve_defaults() is want


@pytest.mark.parametrize("yours, want", [(None, "1"), ("0", "0")])
def test_vllm_x86_serve_turns_the_serve_defaults_on_unless_set(
    monkeypatch, tmp_path, free_port, yours, want
):
    """`vllm-x86 serve` hands over to vLLM's server with VLLM_X86_SERVE_DEFAULTS=1, or
    with the value you set."""
    import os

    from vllm_x86.tools.cli import main

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("VLLM_X86_SERVE_DEFAULTS", "restored after the test")
    if yours is None:
        monkeypatch.delenv("VLLM_X86_SERVE_DEFAULTS")
    else:
        monkeypatch.setenv("VLLM_X86_SERVE_DEFAULTS", yours)
    monkeypatch.setattr("vllm_x86.runtime.defaults.apply_omp_env", lambda: {})
    seen = {}

    def execv(exe, argv):
        seen["serve_defaults"] = os.environ.get("VLLM_X86_SERVE_DEFAULTS")
        raise SystemExit(0)

    monkeypatch.setattr(main.os, "execv", execv)
    with pytest.raises(SystemExit):
        main.main(["serve", str(tmp_path), "--no-daemon", "--port", str(free_port)])
    assert seen == {"serve_defaults": want}
