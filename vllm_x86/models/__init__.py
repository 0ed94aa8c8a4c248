"""Models the plugin can fetch and prepare on its own (see ``catalog.py``)."""
