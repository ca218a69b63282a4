"""Helpers shared by the spec safety tests (test_spec_safety.py, test_spec_properties.py): tiny configs, spec files
written one field per line, the check `fab lower` runs before it loads anything, and calibration files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.lowering.spec import load_spec_file
from orchestrator.tensorfile import NamedTensor, write_tensors

# transformers configs' keyword arguments
DISTILBERT_TINY: dict[str, Any] = {"vocab_size": 1000, "dim": 64, "n_layers": 2, "n_heads": 2, "hidden_dim": 128}
GPT2_TINY: dict[str, Any] = {"vocab_size": 1000, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128}
BERT_TINY: dict[str, Any] = {"vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 64}  # fmt: skip
BASE = {"distilbert": DISTILBERT_TINY, "gpt2": GPT2_TINY, "bert": BERT_TINY}
GIB = 1 << 30


def spec_data(model_type: str = "distilbert", task: str | None = None, **changes: Any) -> dict[str, Any]:
    task = task or ("causal-lm" if model_type == "gpt2" else "fill-mask")
    data: dict[str, Any] = {"name": "safety", "model_type": model_type, "task": task, "seq_len": 32,
                            "config": dict(BASE[model_type])}  # fmt: skip
    if task == "fill-mask":
        data["mask_token_id"] = 103
    return {**data, **changes}


def write_spec(path: Path, data: dict[str, Any]) -> Path:
    """One field per line, so every field has its own line number."""
    path.write_text(json.dumps(data, indent=2))
    return path


def checked(path: Path, *, available: int | None = 16 * GIB) -> Any:
    """The spec file loaded and checked as `fab lower` does before it loads anything."""
    from orchestrator.lowering.sources.builders.models import check_spec

    return check_spec(load_spec_file(path), "random", available=available)


def calibration(path: Path, seq_len: int = 8, vocab_size: int = 200) -> list[tuple]:
    from orchestrator.lowering.quantize.calibration import calibration_from_file

    return calibration_from_file(path, seq_len, vocab_size)


def etlt(path: Path, **arrays: np.ndarray) -> Path:
    write_tensors(path, [NamedTensor(name, array) for name, array in arrays.items()])
    return path
