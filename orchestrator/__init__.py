"""etlab: lower PyTorch transformers with ExecuTorch, run them on a lab of boards, and show where the time goes."""

__version__ = "0.1.0"
