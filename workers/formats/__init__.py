"""How request messages are read and replies written (the worker's format seam)."""
