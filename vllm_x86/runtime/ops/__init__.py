"""The plugin's compute layer. ``registry.py`` is the one table of what it overrides."""
