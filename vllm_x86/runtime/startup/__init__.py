"""Start-up work of the runtime: the compile cache (compile_cache.py), the staged
warm-up that serves eagerly while a compiled model is built (staged.py), the KV cache's
fresh zero pages (kv_alloc.py) and the helpers shared by forked children (childproc.py)."""
