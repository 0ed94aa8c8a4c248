"""`vllm-x86 playground`: a page in the browser to pick, load and try models.

The back end (app.py) is a small FastAPI app: it lists what can be served (models.py),
loads and switches models through the standby daemon (backend.py), proxies chat and
completion requests to the model server, validates structured output (structured.py) and
shows the server's state. `vllm-x86 playground` (cli.py) serves it on its own port;
`vllm-x86 serve --playground` mounts it under /playground/ of vLLM's own server through
vLLM's --middleware flag (asgi.py). The front end is static files in static/.
"""
