"""The standby daemon: vLLM's OpenAI server for a model in seconds instead of tens of seconds.

Most of a vLLM CPU start is fixed cost paid again by every new process: importing torch,
vLLM and the plugin takes seconds, and stock vLLM CPU pays it three times (its engine-core
and worker processes are spawned, each a fresh interpreter). ``vllm-x86 serve`` already
forks those two; the daemon also pays the server's own imports once and keeps them warm:

* ``vllm-x86 daemon start`` launches one background process (``python -m
  vllm_x86.tools.daemon``) with its own pid file, state file and log in ``VLLM_X86_DAEMON_DIR``.
  It imports torch, vLLM, vLLM's OpenAI server, engine, CPU worker and common model
  modules, and the plugin with its kernels, then waits on a Unix socket in that
  directory (an HTTP/JSON API, see ``server``), its owner's only (``access``; TCP only
  with a key).
* ``vllm-x86 serve MODEL`` (or ``POST /serve`` on the control socket) hands the model to
  it: the daemon forks a child that runs vLLM's own OpenAI server entry point
  (``vllm.entrypoints.launchers.api_server.entry.main``) for the model, exactly as
  ``vllm-x86 serve`` would, on the requested port. As in ``vllm-x86 serve``, the
  plugin's platform has vLLM start the engine-core and worker processes by ``fork``
  (``X86Platform._apply_engine_start``), so they also inherit everything imported.
  Serving another model stops the current one and forks again; a model that fails to
  start is reported with its error and the daemon stays up for the next request.
  ``serve`` stays attached (the model server's log on its stderr; Ctrl-C stops that
  model server) unless ``--detach`` (``cli``).
* ``vllm-x86 daemon stop`` stops the served model's process group, then the daemon,
  and removes the pid and state files.

What is deliberately *not* done before the fork: no OpenMP region runs, the daemon
starts no thread of its own (importing torch and vLLM leaves two idle native helper
threads, as in vLLM's own API server when it forks its engine on GPUs) and builds no
vLLM config, because a forked child inherits neither threads nor a usable OpenMP
runtime. Compute threads are therefore pinned per model, in the forked worker (vLLM's
own binding, with the plugin's layout), not in the daemon.

Modules: ``paths`` (files of a daemon directory, their modes, liveness), ``access``
(who may call: peer uid, key, TCP rule, the environment a model server takes),
``server`` (the daemon process and its control API), ``client`` (start, stop, status,
hand-over: what the CLI calls, standard library only), ``cli`` (the ``vllm-x86 daemon``
subcommand and the attached ``serve``).
"""
