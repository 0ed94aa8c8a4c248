"""Ports for the servers the project starts: chosen outside the kernel's ephemeral range
(so no outgoing connection can take one between choosing and binding), and the
"is it taken" check that `vllm-x86 serve` and the daemon make before starting a server."""

from __future__ import annotations

import socket

from vllm_x86.tools import ports


def test_free_port_is_outside_the_ephemeral_range_and_bindable():
    lo, hi = ports.ephemeral_range()
    picked = {ports.free_port() for _ in range(20)}
    assert all(not (lo <= p <= hi) for p in picked), (picked, lo, hi)
    assert all(ports.LOWEST <= p <= 65535 for p in picked)
    assert len(picked) > 1  # random, not one fixed number every worker would share
    for p in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_listening_port_is_taken_and_free_again_once_closed():
    s = socket.socket()
    s.bind(("127.0.0.1", ports.free_port()))
    s.listen()
    port = s.getsockname()[1]
    assert ports.port_free(port) is False
    assert ports.port_free(port, ports.bind_host("0.0.0.0")) is False
    s.close()
    assert ports.port_free(port) is True


def test_a_connected_socket_in_time_wait_does_not_count():
    # A server that closed with a connection open leaves it in TIME_WAIT; a new server
    # binds with SO_REUSEADDR and must be allowed to.
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", ports.free_port()))
    srv.listen()
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT
    srv.close()
    cli.close()
    assert ports.port_free(port) is True


def test_the_message_names_port_and_address():
    msg = ports.port_taken("", 8000)
    assert "port 8000 on 0.0.0.0 is in use by another program" in msg
    assert "--port" in msg
