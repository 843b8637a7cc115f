"""Task plugins for lstmablate, installed under the import name ``lstmablate_tasks``."""
