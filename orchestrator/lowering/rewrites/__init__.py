"""Named graph rewrites (registry.py, torch-free) and their pattern checks and rewrites (huggingface.py, layers.py)."""
