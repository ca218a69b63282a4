"""LiteRT's side of bench_peers.py, run by the Python of LiteRT's own venv (litert-torch, ai-edge-litert,
ai-edge-quantizer; nothing of etlab's is imported here).

    peers_litert.py convert PT2 INPUTS.npz OUT.tflite fp32|int8|int8-static
        the lowering's ExportedProgram (the same module etlab lowers) through `litert_torch.convert`; int8: the fp32
        model through ai-edge-quantizer's `dynamic_wi8_afp32` recipe (per-channel int8 weights, dynamic int8
        activations: LiteRT's own int8 for a converted PyTorch model); int8-static: its `static_wi8_ai8` recipe
        (int8 weights and activations), calibrated on the reference input
    peers_litert.py time MODEL.tflite INPUTS.npz OUTPUTS.npz THREADS WARMUP ITERATIONS
        LiteRT's interpreter (its default XNNPACK delegate), THREADS threads: WARMUP untimed runs, then ITERATIONS
        timed `invoke()`s; prints the times (ms) as a JSON list, writes the outputs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def convert(pt2: Path, inputs: Path, out: Path, precision: str) -> None:
    import litert_torch
    import torch

    arrays = np.load(inputs)
    args = tuple(torch.from_numpy(arrays[name]) for name in arrays.files)
    fp32 = out.with_name(f"model.fp32{out.suffix}")
    if not fp32.is_file():
        module = torch.export.load(str(pt2)).module()
        litert_torch.convert(module, args).export(str(fp32))
    if precision == "int8":
        from ai_edge_quantizer import quantizer, recipe

        quantized = quantizer.Quantizer(str(fp32), recipe.dynamic_wi8_afp32()).quantize()
        quantized.export_model(str(out), overwrite=True)
    elif precision == "int8-static":
        from ai_edge_litert.interpreter import Interpreter
        from ai_edge_quantizer import quantizer, recipe

        signature = next(iter(Interpreter(model_path=str(fp32)).get_signature_list()))
        names = list(Interpreter(model_path=str(fp32)).get_signature_runner(signature).get_input_details())
        sample = {name: arrays[key] for name, key in zip(names, arrays.files, strict=True)}
        static = quantizer.Quantizer(str(fp32), recipe.static_wi8_ai8())
        calibration = static.calibrate({signature: [sample]})
        static.quantize(calibration).export_model(str(out), overwrite=True)


def time_model(model: Path, inputs: Path, outputs: Path, threads: int, warmup: int, iterations: int) -> None:
    from ai_edge_litert.interpreter import Interpreter

    arrays = np.load(inputs)
    interpreter = Interpreter(model_path=str(model), num_threads=threads)
    runner = interpreter.get_signature_runner()
    details = runner.get_input_details()  # the signature's names: args_0, args_1, ... in the module's order
    feed = {name: to_input(arrays[key], details[name]) for name, key in zip(details, arrays.files, strict=True)}
    for _ in range(warmup):
        runner(**feed)
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        result = runner(**feed)
        times.append((time.perf_counter() - started) * 1000.0)
    out_details = runner.get_output_details()
    ordered = sorted(result, key=_index)
    # Any: mypy would match the arrays against savez's allow_pickle too
    named: dict[str, Any] = {f"output_{i}": from_output(result[key], out_details[key]) for i, key in enumerate(ordered)}
    np.savez(outputs, **named)
    print(json.dumps(times))


def to_input(array: np.ndarray, detail: dict) -> np.ndarray:
    """The reference input as the model takes it: int64 ids as int32 (LiteRT's), a float image quantized where the
    static recipe made the input int8."""
    dtype = np.dtype(detail["dtype"])
    scale, zero = detail.get("quantization", (0.0, 0))
    if np.issubdtype(dtype, np.integer) and array.dtype.kind == "f" and scale:
        info = np.iinfo(dtype)
        return np.clip(np.round(array / scale + zero), info.min, info.max).astype(dtype)
    return array.astype(dtype)


def from_output(array: np.ndarray, detail: dict) -> np.ndarray:
    scale, zero = detail.get("quantization", (0.0, 0))
    if array.dtype.kind in "iu" and scale:
        return (array.astype(np.float32) - zero) * scale
    return array


def _index(name: str) -> int:
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits else 0


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "convert":
        convert(Path(rest[0]), Path(rest[1]), Path(rest[2]), rest[3])
    else:
        time_model(Path(rest[0]), Path(rest[1]), Path(rest[2]), int(rest[3]), int(rest[4]), int(rest[5]))
