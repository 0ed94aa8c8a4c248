"""The docs name what exists: every relative link and every repository path or module
written in backticks in README.md, CONTRIBUTING.md and docs/*.md.

Checked, without importing anything of the project:
- relative links ``[text](path#anchor)``: the file exists and, for a Markdown file, the
  anchor is one of its headings (GitHub's heading ids);
- backticked paths rooted at the repository (``vllm_x86/...``, ``tests/...``,
  ``docs/...``, top-level files), also inside commands: the file or folder exists, and a
  ``::test_name`` or ``:name`` after a Python file is defined in it;
- backticked partial paths (``quant/scope.py``, ``csrc/amx_gemm.cpp``): the end of a path
  in this repository, or in the installed vLLM, torch or transformers that the docs
  quote;
- backticked module names ``vllm_x86.a.b`` (and ``python -m vllm_x86...``): the module
  exists, and a name after it is defined there.

Links and paths into docs/bench/ (the benchmark reports) are left to the test of those
reports. Run as a script to list every problem at once:
``.venv/bin/python tests/unit/test_docs_links.py``.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_FILES = {
    "Makefile",
    "pyproject.toml",
    "setup.py",
    "requirements.txt",
    "requirements-dev.txt",
    "README.md",
    "CONTRIBUTING.md",
    "LICENSE",
    "MANIFEST.in",
    ".pre-commit-config.yaml",
}
ROOTED = ("vllm_x86/", "tests/", "docs/", "benchmarks/", "scripts/")
EXTS = ("py", "cpp", "h", "md", "json", "txt", "toml", "yaml", "cfg", "sh", "in")
# a path-like token: letters, digits, _ . / - and at most a glob star
PATH_TOKEN = re.compile(r"^[\w./*-]+\.(?:" + "|".join(EXTS) + r")$")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
FENCE = re.compile(r"^(```|~~~)")
SKIP_PREFIX = "docs/bench/"
NOT_PATHS = {"llama.cpp"}  # names that look like files
# Files of vLLM's and PyTorch's source repositories that their wheels do not install
# (the patch ledger names them as what a patch is written against).
UPSTREAM_SOURCES = {"csrc/cpu/torch_bindings.cpp", "aten/src/ATen/native/native_functions.yaml"}


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [f for f in files if f.exists()]


def github_anchor(heading: str) -> str:
    """GitHub's id for a Markdown heading: lower case, formatting and punctuation
    dropped (letters, digits, ``_``, ``-`` and spaces kept), spaces turned into ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = text.replace("`", "").strip().lower()
    kept = []
    for ch in text:
        if ch in " -_" or unicodedata.category(ch)[0] in "LN":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors_of(text: str) -> set[str]:
    """The ids GitHub gives the headings of a Markdown text (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if in_fence or not m:
            continue
        base = github_anchor(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    return frozenset(anchors_of(path.read_text(encoding="utf-8")))


@functools.cache
def defined_names(path: Path) -> frozenset[str]:
    """Top-level names of a Python file, and the methods of its classes."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names.update(
                    f"{node.name}.{b.name}"
                    for b in node.body
                    if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))
                )
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
    return frozenset(names)


@functools.cache
def known_suffixes() -> frozenset[str]:
    """Every file of this repository and of the installed vLLM, torch and transformers,
    as relative paths (``a/b/c.py``), for matching partial paths by their end."""
    bases = [ROOT]
    for name in ("vllm", "torch", "transformers"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            bases.append(Path(spec.origin).parent.parent)
    skip = {".git", ".venv", "__pycache__", "node_modules", "out", "build"}
    paths: set[str] = set()
    for base in bases:
        tops = [ROOT] if base == ROOT else [base / n for n in ("vllm", "torch", "transformers")]
        for top in tops:
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames[:] = [d for d in dirnames if d not in skip and not d.endswith(".egg-info")]
                rel = Path(dirpath).relative_to(base).as_posix()
                prefix = "" if rel == "." else rel + "/"
                paths.update(prefix + f for f in filenames)
    return frozenset(paths)


def _suffix_exists(token: str) -> bool:
    token = token.strip("/")
    for p in known_suffixes():
        if p == token or p.endswith("/" + token):
            return True
        if "/" + token + "/" in "/" + p:  # a folder
            return True
    return False


def _module_file(dotted: str) -> tuple[Path | None, list[str]]:
    """The longest prefix of ``dotted`` that is a module of this repository (a .py file, a
    package, or a compiled extension), and the names after it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), parts[i:]
        if (base / "__init__.py").is_file():
            return base / "__init__.py", parts[i:]
        if parts[:i] == ["vllm_x86", "runtime", "_C"] or list(base.parent.glob(base.name + ".*so")):
            return base, []  # the C++ extension: its names are not checked
    return None, parts


def check_module(dotted: str) -> str | None:
    dotted = dotted.rstrip("().,;:")
    path, rest = _module_file(dotted)
    if path is None:
        return f"no module {dotted}"
    if path.suffix == ".py" and rest:
        names = defined_names(path)
        if rest[0] not in names and ".".join(rest[:2]) not in names:
            where = path.relative_to(ROOT)
            return f"{'.'.join(rest)} is neither a module nor a name defined in {where}"
    return None


def check_path(token: str) -> str | None:
    """A backticked path, rooted or partial; None when it exists."""
    token = token.rstrip(".,;:)").lstrip("(")
    name = None
    if "::" in token:
        token, _, name = token.partition("::")
        name = name.split("[")[0].split("::")[-1]
    elif re.search(r"\.py:\w", token):
        token, _, name = token.partition(":")
    if token.startswith("./"):
        token = token[2:]
    if token.startswith(SKIP_PREFIX) or token.startswith(("out/", "/", "~")):
        return None
    rooted = token.startswith(ROOTED) or token in TOP_FILES
    if rooted:
        matches = list(ROOT.glob(token)) if "*" in token else [ROOT / token]
        if not any(m.exists() for m in matches):
            return f"{token} does not exist"
        target = matches[0]
    elif (
        PATH_TOKEN.match(token)
        and "*" not in token
        and token not in NOT_PATHS | UPSTREAM_SOURCES
        and ("/" in token or token.rsplit(".", 1)[-1] in ("py", "cpp", "h"))
    ):
        if not _suffix_exists(token):
            return f"no file ends with {token}"
        hits = [ROOT / p for p in known_suffixes() if p == token or p.endswith("/" + token)]
        hits = [h for h in hits if h.is_file()]
        target = hits[0] if len(hits) == 1 else None
    else:
        return None
    if name and target is not None and target.suffix == ".py":
        first = name.split(".")[0].rstrip("()")
        names = defined_names(target)
        if first not in names and name.rstrip("()") not in names:
            return f"{name} is not defined in {target.relative_to(ROOT)}"
    return None


def _spans(text: str):
    """(line number, kind, text) for links and code in a Markdown text; fenced blocks
    give their lines as code."""
    in_fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if in_fence:
            yield n, "code", line
            continue
        for m in LINK.finditer(line):
            yield n, "link", m.group(1) or m.group(2)
        for m in CODE_SPAN.finditer(line):
            yield n, "code", m.group(2)


def problems_in(text: str, base: Path, label: str) -> list[str]:
    """Every link or path in ``text`` (Markdown, links relative to ``base``) that does not
    name something that exists, as ``label:line: what``."""
    out = []
    for n, kind, value in _spans(text):
        if kind == "link":
            if re.match(r"^[a-z][a-z0-9+.-]*:", value):  # http:, https:, mailto:
                continue
            target_s, _, anchor = value.partition("#")
            target = (base / target_s).resolve() if target_s else None
            if target is None:  # an anchor in the same page
                out += (
                    [f"{label}:{n}: link {value}: no such heading"]
                    if anchor not in {a for a in anchors_of(text)}
                    else []
                )
                continue
            try:
                in_repo = target.relative_to(ROOT).as_posix()
            except ValueError:
                out.append(f"{label}:{n}: link {value} leaves the repository")
                continue
            if in_repo.startswith(SKIP_PREFIX):
                continue
            if not target.exists():
                out.append(f"{label}:{n}: link {value}: {in_repo} does not exist")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                out.append(f"{label}:{n}: link {value}: no heading #{anchor} in {in_repo}")
            continue
        for token in value.split():
            token = token.strip("'\"")
            module = re.match(r"^vllm_x86(\.\w+)+", token)
            if module and "/" not in token:
                msg = check_module(module.group(0))
            else:
                msg = check_path(token)
            if msg:
                out.append(f"{label}:{n}: `{token}`: {msg}")
    return out


def problems(path: Path) -> list[str]:
    return problems_in(path.read_text(encoding="utf-8"), path.parent, str(path.relative_to(ROOT)))


def test_github_anchor_follows_githubs_rules():
    assert (
        github_anchor("Three rounds, compiled (2026-12-05)") == "three-rounds-compiled-2026-12-05"
    )
    assert (
        github_anchor("The prepacked format (`vllm-x86 quantize`)")
        == "the-prepacked-format-vllm-x86-quantize"
    )
    assert github_anchor("Without AMX: 8-bit activations") == "without-amx-8-bit-activations"


def test_the_checker_finds_what_does_not_exist():
    assert check_path("vllm_x86/runtime/ops/registry.py") is None
    assert check_path("vllm_x86/runtime/ops/registry.py:register_all") is None
    assert "does not exist" in check_path("benchmarks/side_by_side.py")
    assert "not defined" in check_path("vllm_x86/runtime/ops/registry.py:no_such_function")
    assert "not defined" in check_path("tests/unit/test_layers.py::test_no_such_test")
    assert check_path("quant/scope.py") is None
    assert "no file ends with" in check_path("models/archs_gone.py")
    assert check_module("vllm_x86.tools.conformance.suite") is None
    assert check_module("vllm_x86.models.routing") is not None


def test_the_checker_reads_links_code_and_fences():
    text = """# A page

[fine](quantization.md#the-prepacked-format-vllm-x86-quantize), [here](#a-page),
[gone](nowhere.md), [no heading](quantization.md#no-such-heading), [out](https://x.org)
`vllm_x86/runtime/ops/registry.py`, `vllm_x86/nowhere.py`, `benchmarks/` and `out/run/`

```bash
python -m vllm_x86.tools.bench.micro.ops
python -m vllm_x86.models.routing ARCH
```
"""
    found = problems_in(text, ROOT / "docs", "page.md")
    assert [f.split(": ", 1)[0] for f in found] == ["page.md:4", "page.md:4"] + [
        "page.md:5",
        "page.md:5",
        "page.md:9",
    ], found
    assert "nowhere.md" in found[0] and "#no-such-heading" in found[1]
    assert "vllm_x86/nowhere.py" in found[2] and "benchmarks/" in found[3]
    assert "vllm_x86.models.routing" in found[4]


def test_the_reading_order_covers_every_page():
    """docs/README.md links every page of docs/, so a new page gets its place in it."""
    index = ROOT / "docs" / "README.md"
    linked = {
        (index.parent / m.group(1)).resolve().name
        for m in re.finditer(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", index.read_text(encoding="utf-8"))
    }
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert not pages - linked, f"docs/README.md does not list {sorted(pages - linked)}"


def test_every_link_and_path_in_the_docs_exists():
    found = [p for f in doc_files() for p in problems(f)]
    assert not found, "\n".join(found)


if __name__ == "__main__":
    found = [p for f in doc_files() for p in problems(f)]
    print("\n".join(found) or "all links and paths exist")
    sys.exit(1 if found else 0)
