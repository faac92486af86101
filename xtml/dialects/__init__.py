"""Built-in dialect files (templates as data)."""
