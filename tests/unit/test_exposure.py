"""The one rule for where a server may listen and with which key (tools/exposure.py)."""

from __future__ import annotations

import pytest

from vllm_x86.tools import exposure


@pytest.mark.parametrize(
    "host,loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("", False),
        ("::", False),
        ("192.168.1.10", False),
        ("10.0.0.1", False),
        ("example.org", False),
        ("localhost.example.org", False),
    ],
)
def test_is_loopback(host, loopback):
    assert exposure.is_loopback(host) is loopback


def test_api_key_from_flags_then_environment():
    assert exposure.api_key(["--api-key", "k1"], {}) == "k1"
    assert exposure.api_key(["--api-key=k2"], {"VLLM_API_KEY": "env"}) == "k2"
    assert exposure.api_key(["--api-key", "a", "--api-key", "b"], {}) == "b"  # argparse: last
    assert exposure.api_key([], {"VLLM_API_KEY": "env"}) == "env"
    assert exposure.api_key([], {"VLLM_API_KEY": ""}) is None
    assert exposure.api_key(["--port", "8000"], {}) is None


@pytest.mark.parametrize("surface", [exposure.API, exposure.CONTROL])
def test_loopback_or_a_key_needs_no_warning(surface):
    assert exposure.check("127.0.0.1", None, surface=surface, what="x").warning is None
    v = exposure.check("0.0.0.0", "secret", surface=surface, what="x")
    assert v.warning is None and v.keyed and not v.loopback


def test_api_on_the_network_without_a_key_starts_with_a_warning_naming_the_risk():
    v = exposure.check("0.0.0.0", None, surface=exposure.API, what="the OpenAI server", port=8000)
    assert not v.loopback and not v.keyed
    assert "0.0.0.0 (every network interface), port 8000" in v.warning
    assert "no API key" in v.warning and "anyone who can reach this port" in v.warning
    assert "--api-key" in v.warning and "VLLM_API_KEY" in v.warning


def test_control_on_the_network_without_a_key_is_refused():
    with pytest.raises(exposure.ExposureError) as e:
        exposure.check("192.168.1.10", None, surface=exposure.CONTROL, what="the playground")
    msg = str(e.value)
    assert msg.startswith("the playground will not listen on 192.168.1.10 without a key")
    assert "--trust-remote-code" in msg and "127.0.0.1" in msg


def test_unknown_surface_is_a_programming_error():
    with pytest.raises(ValueError):
        exposure.check("127.0.0.1", None, surface="web", what="x")


def test_authorized_compares_the_bearer_token():
    assert exposure.authorized(None, None)
    assert exposure.authorized("anything", "")
    assert exposure.authorized("Bearer s3cret", "s3cret")
    assert not exposure.authorized(None, "s3cret")
    assert not exposure.authorized("Bearer wrong", "s3cret")
    assert not exposure.authorized("s3cret", "s3cret")  # the scheme is required
    assert not exposure.authorized("Basic s3cret", "s3cret")
