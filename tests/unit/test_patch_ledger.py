"""The patch ledger (vllm_x86/runtime/patches/ledger.py): every record holds against the
installed vLLM, torch and transformers; every patch site in the runtime's code is a
record; docs/patches.md shows the ledger as it is."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_x86.runtime.patches import ledger
from vllm_x86.runtime.patches.ledger import LEDGER

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "vllm_x86" / "runtime"


# ----------------------------------------------------------------------------- records


def test_records_are_complete():
    names = [p.name for p in LEDGER]
    assert len(names) == len(set(names)), "two records with one name"
    for p in LEDGER:
        assert p.kind in ledger.KINDS, f"{p.name}: kind {p.kind!r} is not one of KINDS"
        for field in ("what", "why", "vllm_file", "written_against", "removed_by"):
            assert getattr(p, field).strip(), f"{p.name}: no {field}"
        assert p.symbols and p.site and p.tests, p.name
        assert any(w in p.written_against for w in ("vllm ", "torch ", "transformers ")), (
            f"{p.name}: written_against names no package and version"
        )


@pytest.mark.parametrize("patch", LEDGER, ids=lambda p: p.name)
def test_tests_named_by_a_record_exist(patch):
    for test in patch.tests:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), f"{patch.name}: no test file {path}"
        if name:
            assert f"def {name}(" in (ROOT / path).read_text(), f"{patch.name}: no {test}"


@pytest.mark.parametrize("patch", LEDGER, ids=lambda p: p.name)
def test_sites_named_by_a_record_exist(patch):
    for site in patch.site:
        module, _, qual = site.partition(":")
        if not qual:
            assert importlib.util.find_spec(module) is not None, f"{patch.name}: no {site}"
            continue
        obj = importlib.import_module(module)
        for part in qual.split("."):
            assert hasattr(obj, part), f"{patch.name}: {site} is not in the code"
            obj = getattr(obj, part)


@pytest.mark.parametrize("patch", LEDGER, ids=lambda p: p.name)
def test_installed_packages_still_have_what_the_patch_relies_on(patch):
    """Fails after a vLLM (torch, transformers) bump that moved, renamed, re-signed or
    (where the plugin repeats its steps) changed what this patch is written against:
    re-read the record's file, carry the change over or drop the patch, then update the
    record."""
    problems = ledger.check(patch)
    assert not problems, (
        f"patch {patch.name} (written against {patch.written_against}, "
        f"{patch.vllm_file}; installed: {ledger.installed_versions()}):\n  " + "\n  ".join(problems)
    )


def test_a_changed_signature_fails_and_names_it():
    """The check is not a formality: a record that disagrees with the install fails."""
    from dataclasses import replace

    p = ledger.get("tied_embedding_gemm_once")
    sym = replace(p.symbols[0], params="layer")
    problems = ledger.check(replace(p, symbols=(sym,)))
    assert problems == [
        "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm takes "
        "(layer, remove_weight), the record says (layer)"
    ]
    gone = ledger.Symbol("vllm.model_executor.layers.utils:no_such_function")
    assert "is gone" in ledger.check(replace(p, symbols=(gone,)))[0]
    moved = replace(p.symbols[1], contains=("a line vLLM does not have",))
    assert "no longer contains" in ledger.check(replace(p, symbols=(moved,)))[0]
    changed = ledger.Symbol(ledger.get("x86_worker_constructor").target, fingerprint="0" * 16)
    assert "carry the change over" in ledger.check(replace(p, symbols=(changed,)))[0]


def test_docs_show_the_ledger():
    doc = (ROOT / "docs" / "patches.md").read_text()
    assert ledger.markdown() in doc, (
        "docs/patches.md is not the ledger: run "
        "`python -m vllm_x86.runtime.patches --write docs/patches.md`"
    )


# ----------------------------------------------------------------------------- completeness
#
# A patch site the ledger does not name fails here. What the scan finds in the runtime's
# code, and is not a patch, is listed below with the reason.

NOT_PATCHES = {
    # (module:qualname, what) -> why it is not a patch
    ("vllm_x86.runtime.ops.registry:_register_oot", "attribute"): "the op table names its "
    "own subclass after vLLM's op (ops/registry.py)",
    ("vllm_x86.runtime.ops.registry:apply_module_overrides", "attribute"): "the op table's "
    "module and router rows switch a loaded module's class; each row says why",
    ("vllm_x86.runtime.quant.moe:X86QuantMoEMethod.process_weights_after_loading", "attribute"): (
        "a quantization method sets its own layer's parameters (vLLM's FusedMoEMethodBase "
        "interface)"
    ),
    ("vllm_x86.runtime.quant.linear:_set", "attribute"): "a quantization method replaces "
    "its own layer's parameter (vLLM's LinearMethodBase interface)",
    ("vllm_x86.runtime.ops.file_embedding:attach", "attribute"): "the op table's "
    "VocabParallelEmbedding row: the switched module's table moves to its file and its "
    "unused GEMM copy goes (model objects, not vLLM's code)",
    ("vllm_x86.runtime.quant.lm_head:release_unshared_weights", "attribute"): "the LM head "
    "method empties its own layer's bf16 weight once its quantized copy exists (vLLM's "
    "QuantizeMethodBase interface)",
    ("vllm_x86.runtime.platform:X86Platform._apply_async_scheduling", "attribute"): "the "
    "platform's config hook: a documented default (docs/configuration.md)",
    ("vllm_x86.runtime.platform:X86Platform._apply_mla_backend", "attribute"): "the "
    "platform's config hook: a documented default (docs/configuration.md)",
    ("vllm_x86.runtime.platform:X86Platform._apply_kv_cache_size", "attribute"): "the "
    "platform's config hook: a documented default (docs/configuration.md)",
    ("vllm_x86.runtime.platform:X86Platform.check_and_update_config", "attribute"): "the "
    "platform's config hook: the plugin's worker class (docs/configuration.md)",
    ("vllm_x86.runtime.platform:_mark_chosen", "environment"): "the plugin's own internal "
    "variable (VLLM_X86_CHOSEN, envs.py)",
    ("vllm_x86.runtime.platform:X86Platform._apply_thread_layout", "environment"): "vLLM's "
    "documented VLLM_CPU_OMP_THREADS_BIND, as the plugin's default (docs/configuration.md)",
    ("vllm_x86.runtime.platform:X86Platform._apply_kv_cache_size", "environment"): "the "
    "plugin's own internal variable (VLLM_X86_KV_BYTES_CHOSEN, envs.py)",
    ("vllm_x86.runtime.startup.compile_cache:apply", "environment"): "vLLM's documented "
    "VLLM_CACHE_ROOT, pointed at the plugin's keyed cache (docs/configuration.md)",
}

_PRIVATE_OK_BASES = {"os", "sys"}  # os._exit and the like: the standard library's
# Attributes the plugin keeps on vLLM's objects under its own prefix (a quantized
# layer's kernel choice, cached views): its own state, not a change of vLLM's.
_OWN_ATTRIBUTE_PREFIXES = ("x86_", "_x86_", "_vllm_x86_")
# The ledger itself reads torch's operator schemas: the checker, not a patch.
_NOT_SCANNED = {"vllm_x86.runtime.patches.ledger"}


def _runtime_modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(RUNTIME.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((".".join(parts), path))
    return out


def _defined_names() -> set[str]:
    """Every name the plugin's own code defines, and its module names: a private name
    not among them belongs to installed code."""
    names: set[str] = set()
    for path in (ROOT / "vllm_x86").rglob("*"):
        names.add(path.name.split(".")[0])
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr":
                if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                    names.add(str(node.args[1].value))
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


class _Scan(ast.NodeVisitor):
    """Patch sites in one module: (qualname of the enclosing def or class, what, detail)."""

    def __init__(self, defined: set[str]):
        self.defined = defined
        self.stack: list[str] = []
        self.firsts: list[str | None] = []  # each enclosing function's first parameter
        self.hits: list[tuple[str, str, str]] = []

    def _hit(self, what: str, detail: str) -> None:
        self.hits.append((".".join(self.stack), what, detail))

    def _scoped(self, node) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    def visit_FunctionDef(self, node):
        args = node.args.posonlyargs + node.args.args
        self.firsts.append(args[0].arg if args else None)
        self._scoped(node)
        self.firsts.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _own(self, expr) -> bool:
        """``self`` (``cls``) of the method being scanned: the plugin's own object."""
        return (
            isinstance(expr, ast.Name)
            and expr.id in ("self", "cls")
            and bool(self.firsts)
            and self.firsts[-1] == expr.id
        )

    def visit_ClassDef(self, node):
        for base in node.bases:
            if ast.unparse(base).split(".")[-1] in ("TorchFunctionMode", "TorchDispatchMode"):
                self.stack.append(node.name)
                self._hit("function mode", ast.unparse(base))
                self.stack.pop()
        self._scoped(node)

    def _target(self, t) -> None:
        if isinstance(t, ast.Attribute):
            if not self._own(t.value) and not t.attr.startswith(_OWN_ATTRIBUTE_PREFIXES):
                self._hit("attribute", ast.unparse(t))
        elif isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ":
            self._hit("environment", ast.unparse(t))
        elif isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules":
            self._hit("import system", ast.unparse(t))
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._target(e)

    def visit_Assign(self, node):
        for t in node.targets:
            self._target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node):
        for t in node.targets:
            self._target(t)
        self.generic_visit(node)

    def visit_Call(self, node):
        func = ast.unparse(node.func)
        first = ast.unparse(node.args[0]) if node.args else ""
        if func in ("setattr", "delattr") and not (node.args and self._own(node.args[0])):
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.JoinedStr) and name.values:
                name = name.values[0]  # f"x86_{which}_group": its constant head
            own = (
                isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and name.value.startswith(_OWN_ATTRIBUTE_PREFIXES)
            )
            if not own:
                self._hit("attribute", f"{func}({first}, ...)")
        if func in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                if _private(name.value) and name.value not in self.defined:
                    self._hit("private name", name.value)
        if func.startswith("os.environ.") and func.split(".")[-1] in (
            "pop",
            "update",
            "setdefault",
            "clear",
            "popitem",
        ):
            self._hit("environment", func)
        if func in ("os.putenv", "os.unsetenv"):
            self._hit("environment", func)
        if func.startswith(("sys.meta_path.", "sys.path_hooks.")):
            self._hit("import system", func)
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        if node.module and not node.module.startswith("vllm_x86") and node.level == 0:
            for alias in node.names:
                if _private(alias.name):
                    self._hit("private name", alias.name)
        self.generic_visit(node)

    def visit_Attribute(self, node):
        text = ast.unparse(node)
        if text.startswith(("torch.ops._C.", "torch.ops.aten._")) and text.count(".") == 3:
            self._hit("private name", node.attr)
        elif (
            isinstance(node.ctx, ast.Load)
            and _private(node.attr)
            and node.attr not in self.defined
            and not (isinstance(node.value, ast.Name) and node.value.id in _PRIVATE_OK_BASES)
        ):
            self._hit("private name", node.attr)
        self.generic_visit(node)


def _covering(module: str, qual: str) -> list[ledger.Patch]:
    out = []
    for p in LEDGER:
        for site in p.site:
            m, _, q = site.partition(":")
            if m == module and (not q or qual == q or qual.startswith(q + ".")):
                out.append(p)
                break
    return out


def _names_of(patch: ledger.Patch) -> str:
    """What a record says it relies on, as text a private name can be found in."""
    return " ".join(
        " ".join((s.path.replace(":", "."), *s.contains)) for s in patch.symbols
    ).replace("(", " ")


def _mentions(patch: ledger.Patch, name: str) -> bool:
    import re

    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", _names_of(patch))


def scan() -> list[tuple[str, str, str, str]]:
    """(module, qualname, what, detail) of every patch site in the runtime's code."""
    defined = _defined_names()
    out = []
    for module, path in _runtime_modules():
        if module in _NOT_SCANNED:
            continue
        s = _Scan(defined)
        s.visit(ast.parse(path.read_text()))
        out += [(module, *hit) for hit in s.hits]
    return out


def test_every_patch_site_in_the_runtime_is_in_the_ledger():
    """Attribute writes on objects that are not the plugin's own, environment writes,
    import-system changes, TorchFunctionModes and private names of installed code: each
    in a module or function a ledger record names (a private name: one the record lists
    among what it relies on), or in NOT_PATCHES with its reason."""
    missing = []
    for module, qual, what, detail in scan():
        if (f"{module}:{qual}", what) in NOT_PATCHES:
            continue
        records = _covering(module, qual)
        if what == "private name":
            records = [p for p in records if _mentions(p, detail)]
        if not records:
            missing.append(f"{module}:{qual}: {what} {detail}")
    assert not missing, (
        "patch sites the ledger does not name (add a record to "
        "vllm_x86/runtime/patches/ledger.py, or a reason to NOT_PATCHES here):\n  "
        + "\n  ".join(missing)
    )


def test_not_patches_are_still_there():
    """NOT_PATCHES keeps no entry the code no longer has."""
    found = {(f"{m}:{q}", what) for m, q, what, _ in scan()}
    assert set(NOT_PATCHES) <= found, set(NOT_PATCHES) - found


def test_the_scan_finds_a_new_patch(tmp_path):
    """The scan is not a formality: the kinds of code a patch is made of are found."""
    code = textwrap.dedent(
        """
        import os
        from torch.overrides import TorchFunctionMode
        from vllm.v1.worker import gpu_worker
        from vllm.compilation.decorators import _model_hash_key

        class Mode(TorchFunctionMode):
            pass

        def patch():
            gpu_worker.Worker.load_model = None
            os.environ.pop("VLLM_SOMETHING")
            return gpu_worker._private_helper

        def patch_class():
            from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as cls

            cls.finalize_loading = None  # `cls` here is not a classmethod's own class

        class Own:
            def method(self):
                self.x = 1  # its own attribute: not a patch
                self.x86_views = None
        """
    )
    s = _Scan(_defined_names())
    s.visit(ast.parse(code))
    assert sorted(s.hits) == sorted(
        [
            ("Mode", "function mode", "TorchFunctionMode"),
            ("", "private name", "_model_hash_key"),
            ("patch", "attribute", "gpu_worker.Worker.load_model"),
            ("patch", "environment", "os.environ.pop"),
            ("patch", "private name", "_private_helper"),
            ("patch_class", "attribute", "cls.finalize_loading"),
        ]
    )


def _op_table_targets() -> dict[type, list[type]]:
    """Mixin class -> the vLLM classes the op table combines it with."""
    from vllm_x86.runtime.ops import registry

    out: dict[type, list[type]] = {}
    for row in registry.OVERRIDES:
        if ":" not in row.target or ":" not in row.impl:
            continue
        try:
            target, impl = registry._load(row.target), registry._load(row.impl)
        except (ImportError, AttributeError):
            continue
        if isinstance(target, type) and isinstance(impl, type):
            out.setdefault(impl, []).append(target)
    return out


def _calls_super_init(fn) -> bool:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError):
        return True
    return any(
        isinstance(n, ast.Call) and ast.unparse(n.func) == "super().__init__"
        for n in ast.walk(tree)
    )


def test_private_overrides_and_constructors_are_in_the_ledger():
    """A class of the runtime that overrides a private method of an installed class (its
    own base, or the vLLM class the op table mixes it into) names that method in a
    record; an __init__ that does not call super().__init__ is a reimplemented
    constructor, and a record says so."""
    mixed = _op_table_targets()
    missing = []
    for module, _ in _runtime_modules():
        mod = importlib.import_module(module)
        for cls in vars(mod).values():
            if not (isinstance(cls, type) and cls.__module__ == module):
                continue
            foreign = [c for c in cls.__mro__ if not c.__module__.startswith("vllm_x86")]
            foreign += [c for t in mixed.get(cls, []) for c in t.__mro__]
            for name, fn in vars(cls).items():
                if not callable(getattr(fn, "__func__", fn)):
                    continue
                if name != "__init__" and not _private(name):
                    continue
                if not any(name in vars(c) for c in foreign if c is not object):
                    continue
                qual = f"{cls.__qualname__}.{name}"
                records = _covering(module, qual)
                if name == "__init__":
                    if _calls_super_init(fn):
                        continue
                    records = [p for p in records if p.kind == "reimplemented constructor"]
                else:
                    records = [p for p in records if _mentions(p, name)]
                if not records:
                    missing.append(f"{module}:{qual}")
    assert not missing, "overrides of installed code the ledger does not name:\n  " + (
        "\n  ".join(missing)
    )


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_apply_all_changes_only_what_the_ledger_names():
    """After the runtime patches are applied, every attribute of a vLLM, torch or
    transformers module or class that holds the plugin's code, and every import hook of
    the plugin, is a symbol of a monkey-patch or import-hook record."""
    code = r"""
import json, sys, types
from vllm_x86.runtime import patches
patches.apply_all()
found = []
for name, mod in list(sys.modules.items()):
    if mod is None or name.split(".")[0] not in ("vllm", "torch", "transformers"):
        continue
    try:
        items = list(vars(mod).items())
    except TypeError:
        continue
    owners = [(name, items)]
    for k, v in items:
        if isinstance(v, type) and getattr(v, "__module__", None) == name:
            owners.append((f"{name}:{v.__qualname__}", list(vars(v).items())))
    for owner, attrs in owners:
        for k, v in attrs:
            if isinstance(v, (types.FunctionType, type)) and str(
                getattr(v, "__module__", "")
            ).startswith("vllm_x86"):
                found.append([owner, k])
hooks = [type(f).__module__ for f in sys.meta_path if type(f).__module__.startswith("vllm_x86")]
print("FOUND " + json.dumps({"attrs": found, "hooks": hooks}))
"""
    p = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300
    )
    line = [x for x in p.stdout.splitlines() if x.startswith("FOUND ")]
    assert line, p.stderr[-3000:]
    found = json.loads(line[0][6:])
    symbols = {s.path for r in LEDGER if r.kind == "monkey-patch" for s in r.symbols}
    attrs = set()
    for owner, attr in found["attrs"]:
        path = f"{owner}.{attr}" if ":" in owner else f"{owner}:{attr}"
        assert path in symbols or owner in symbols, f"{path} holds the plugin's code: no record"
        attrs.add(path)
    assert attrs == {
        "torch._dynamo.aot_compile_types:BundledAOTAutogradSerializableCallable.finalize_loading",
        "vllm.renderers.base:BaseRenderer.start_mm_warmup_in_background",
        "vllm.renderers.base:BaseRenderer.warmup",
        "vllm.renderers.hf:maybe_make_thread_pool",
        "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm",
        "vllm.entrypoints.serve.middleware.authenticate:AuthenticationMiddleware.__call__",
        "vllm.sampling_params:SamplingParams._validate_structured_outputs",
        "vllm.v1.structured_output:StructuredOutputManager.grammar_bitmask",
        "vllm.v1.sample.sampler:Sampler.forward",
    }
    hook_sites = {s for r in LEDGER if r.kind == "import hook" for s in r.site}
    assert found["hooks"] and set(found["hooks"]) <= hook_sites


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_step_profile_patches_only_what_its_record_names(tmp_path):
    """VLLM_X86_STEP_PROFILE (the harness's profiling mode) adds exactly the wrappers its
    record names to what apply_all installs; without it, apply_all installs none of them
    (the expected set of the test above)."""
    code = r"""
import json, os, sys, types
from vllm_x86.runtime import patches

def found():
    out = set()
    for name, mod in list(sys.modules.items()):
        if mod is None or name.split(".")[0] != "vllm":
            continue
        for k, v in list(vars(mod).items()):
            if isinstance(v, type) and v.__module__ == name:
                for a, f in list(vars(v).items()):
                    if isinstance(f, types.FunctionType) and f.__module__.startswith("vllm_x86"):
                        out.add(f"{name}:{v.__qualname__}.{a}")
    return out

os.environ.pop("VLLM_X86_STEP_PROFILE", None)
patches.apply_all()
from vllm_x86.runtime.patches import step_profile
import importlib
for m, _, _ in step_profile.TARGETS:
    importlib.import_module(m)
off = found()
os.environ["VLLM_X86_STEP_PROFILE"] = sys.argv[1]
patches.apply_all()
on = found()
print("FOUND " + json.dumps({"off": sorted(off), "on": sorted(on)}))
"""
    p = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = [x for x in p.stdout.splitlines() if x.startswith("FOUND ")]
    assert line, p.stderr[-3000:]
    found = json.loads(line[0][6:])
    added = set(found["on"]) - set(found["off"])
    record = {s.path for s in ledger.get("step_profile").symbols}
    from vllm_x86.runtime.patches.step_profile import TARGETS

    assert added == {f"{m}:{c}.{a}" for m, c, a in TARGETS}
    assert added <= record
    assert not added & set(found["off"])
