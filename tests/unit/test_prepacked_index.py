"""`vllm-x86 serve MODEL --quantization x86_int4|x86_int8` serves the prepacked checkpoint
`vllm-x86 quantize` wrote from MODEL, when it has the settings the server would use and
the same weights, and says so (tools/quantize/index.py); otherwise it quantizes again."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest

from vllm_x86.runtime.quant.methods import quant_isa

pytestmark = pytest.mark.skipif(
    quant_isa() is None, reason="the CPU has neither AMX nor AVX-512 VNNI (the packing ops)"
)

ENV = {
    "VLLM_X86_QUANT_GROUP_SIZE": "128",
    "VLLM_X86_QUANT_ZERO_POINT": "1",
    "VLLM_X86_QUANT_LM_HEAD": "0",
    "VLLM_X86_QUANT_INT4_ROUNDING": "search",
}


@pytest.fixture(scope="module")
def source(tmp_path_factory, default_model):
    """A copy of the tiny random Llama (hidden 256, 4 layers) and an INT4 (rounded, not
    calibrated) and an INT8 checkpoint of it, recorded as `vllm-x86 quantize` does."""
    from vllm_x86.tools.bench.synthetic import build
    from vllm_x86.tools.quantize import index
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    root = tmp_path_factory.mktemp("prepacked-index")
    src = root / "tiny"
    shutil.copytree(build("tiny-llama"), src)
    outs = {}
    for bits in (4, 8):
        out = root / f"int{bits}"
        quantize_checkpoint(src, out, bits, method="rtn", progress=None)
        assert index.record(src, out) is None
        outs[bits] = out
    return src, outs


def test_found_only_with_the_same_settings_and_weights(source, monkeypatch):
    from vllm_x86.tools.quantize import index

    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    src, outs = source
    assert index.find(src, 4)["out"] == str(outs[4])
    assert index.find(src, 8)["out"] == str(outs[8])
    assert index.find(src, 4)["method"] == "rtn"
    # a setting the checkpoint was not written with: the server quantizes again
    for name, value in (
        ("VLLM_X86_QUANT_INT4_ROUNDING", "minmax"),
        ("VLLM_X86_QUANT_GROUP_SIZE", "64"),
        ("VLLM_X86_QUANT_ZERO_POINT", "0"),
        ("VLLM_X86_QUANT_LM_HEAD", "int4"),
        ("VLLM_X86_USE_PREPACKED", "0"),
    ):
        with monkeypatch.context() as mp:
            mp.setenv(name, value)
            assert index.find(src, 4) is None, name
    with monkeypatch.context() as mp:
        mp.setenv("VLLM_X86_QUANT_LM_HEAD", "1")
        assert index.find(src, 8) is None
    # other weights: a source file changed since
    weights = src / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    try:
        assert index.find(src, 4) is None
    finally:
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert index.find(src, 4) is not None


def test_a_damaged_or_removed_checkpoint_is_not_used(source, tmp_path, monkeypatch):
    from vllm_x86.tools.quantize import index

    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    src, outs = source
    copy = tmp_path / "int4-copy"
    shutil.copytree(outs[4], copy)
    assert index.record(src, copy) is None
    assert index.find(src, 4)["out"] == str(copy)  # the newest of two equal ones
    w = copy / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-4096])  # cut short: the format's check refuses it
    assert index.find(src, 4)["out"] == str(outs[4])
    shutil.rmtree(copy)
    assert index.find(src, 4)["out"] == str(outs[4])


def test_serve_command_line_uses_it_and_says_so(source, monkeypatch, capsys):
    from vllm_x86.tools.cli.common import serve_argv

    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    src, outs = source
    argv, _, _ = serve_argv(str(src), ["--quantization", "x86_int4", "--port", "8123"])
    args = argv[3:]
    assert args[args.index("--model") + 1] == str(outs[4])
    assert "--quantization" not in args
    assert args[args.index("--served-model-name") + 1] == str(src)  # the name it had
    err = capsys.readouterr().err
    assert f"serving the prepacked INT4 checkpoint {outs[4]}" in err
    assert "instead of quantizing" in err and "VLLM_X86_USE_PREPACKED=0" in err

    monkeypatch.setenv("VLLM_X86_USE_PREPACKED", "0")
    argv, _, _ = serve_argv(str(src), ["--quantization", "x86_int4"])
    args = argv[3:]
    assert args[args.index("--model") + 1] == str(src)
    assert args[args.index("--quantization") + 1] == "x86_int4"
    assert "prepacked" not in capsys.readouterr().err


def test_quantize_command_records_it(source, tmp_path, monkeypatch, capsys):
    from vllm_x86.tools.cli.main import main
    from vllm_x86.tools.quantize import index

    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    src, _ = source
    out = tmp_path / "int8-cli"
    assert main(["quantize", str(src), str(out), "--bits", "8", "--no-compile"]) == 0
    assert "x86_int8 (no calibration, rounded to nearest per channel): " in capsys.readouterr().out
    assert index.find(src, 8)["out"] == str(out)
    out4 = tmp_path / "int4-cli"
    cmd = ["quantize", str(src), str(out4), "--bits", "4", "--method", "rtn", "--no-compile"]
    assert main(cmd) == 0  # without calibration text: fast, and it says how it rounded
    assert "x86_int4 (no calibration, groups rounded by search): " in capsys.readouterr().out
    assert index.find(src, 4)["out"] == str(out4)
    # a source that cannot be written (a read-only model store): quantize still succeeds
    # and says what it could not do

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(index.tempfile, "mkstemp", read_only)
    out2 = tmp_path / "int8-cli-2"
    assert main(["quantize", str(src), str(out2), "--bits", "8", "--no-compile"]) == 0
    said = capsys.readouterr().out
    assert "will not find this checkpoint by itself" in said and "Read-only file system" in said
    assert (out2 / "config.json").is_file()


def test_a_checkpoint_keeps_a_4bit_grid_and_is_found_under_the_grid_rule(
    default_model, tmp_path, monkeypatch
):
    """A model whose Linear weights already sit on a 4-bit grid of groups of 32 (as
    dequantized from a GGUF Q4_1 file): `vllm-x86 quantize` keeps the grid (every Linear
    layer in groups of 32, no calibration even when GPTQ was asked for), says so,
    records int4_grid "all", and the server uses it under the grid rule only."""
    from safetensors import safe_open

    from tests.helpers.grid_model import grid_copy
    from vllm_x86.tools.bench.synthetic import build
    from vllm_x86.tools.quantize import index
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    src = grid_copy(build("tiny-llama"), tmp_path / "grid")
    out = tmp_path / "int4"
    said = []
    quantize_checkpoint(src, out, 4, method="gptq", progress=said.append)
    text = "\n".join(said)
    assert "already sit on a 4-bit grid" in text and "GPTQ skipped" in text
    assert "calibrating" not in text
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["int4_grid"] == "all" and qc["method"] == "rtn" and qc["group_size"] == 128
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        scale = f.get_tensor("model.layers.0.mlp.down_proj.weight_scale")
        zp = f.get_tensor("model.layers.0.mlp.down_proj.weight_zp")
    k = 512  # tiny-llama's MLP width: the down projection's inputs
    assert scale.shape[1] == k // 32 * 16 and zp.max() <= 120
    assert (zp % 8 != 0).any()  # zero points between codes, kept in eighths
    assert index.record(src, out) is None
    assert index.find(src, 4)["out"] == str(out)
    monkeypatch.setenv("VLLM_X86_QUANT_INT4_GRID", "0")
    assert index.find(src, 4) is None  # the server would round the weights again
