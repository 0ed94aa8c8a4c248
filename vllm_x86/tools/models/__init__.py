"""Models the plugin can fetch and prepare on its own: the catalog (catalog.py) and its
downloads from PyPI packages (pull.py)."""
