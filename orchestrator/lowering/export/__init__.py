"""Export and lower: `fab lower` (lower.py), the cache key, the quantized and text-generation programs, and
programs users bring (`--exported`, `--pte`).
"""
