"""`fab lower`'s table (commands/render_lowering.py `print_lowering`): the kernels that run outside the delegates apart
from the bookkeeping nodes that run none, and the constants stored twice, as the sidecars of real tiny models record
them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT


def test_the_table_splits_kernels_from_bookkeeping_and_shows_what_is_stored_twice(
    tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts["gpt2-tiny"].paths.folder, root / "gpt2-tiny", copy_function=shutil.copy2)
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "lower", "--model", "gpt2-tiny"],
        cwd=PROJECT_ROOT,
        env={**os.environ, "ETLAB_ARTIFACTS": str(root), "ETLAB_WIDTH": "400"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split("│")[1].strip(): line for line in proc.stdout.splitlines() if line.count("│") > 3}
    for backend in ("portable", "xnnpack"):
        sidecar = tiny_artifacts["gpt2-tiny"].variants[VARIANTS[backend]].sidecar
        outside = sidecar.outside_delegates
        assert outside is not None
        top_op, top_count = next(iter(outside.kernels.items()))
        row = rows[backend]
        # the course's count: every graph node outside the delegates, kernels and bookkeeping together
        assert row.split("│")[4].strip() == str(sidecar.delegation.fallback_ops)
        assert sidecar.delegation.fallback_ops == outside.kernel_calls + sum(outside.bookkeeping.values())
        short = top_op.removeprefix("aten::").removesuffix(".out")
        assert f"{outside.kernel_calls}: {short} ×{top_count}" in row
        bookkeeping = outside.bookkeeping
        assert f"alloc {bookkeeping['memory_planning']}, getitem {bookkeeping['tuple_access']}" in row
        assert f"{outside.stored_twice_bytes / 1e6:.3f}" in row
        # the tied 1000×64 float embedding sits outside and inside the XNNPACK delegates; portable has none
        assert (outside.stored_twice_bytes >= 1000 * 64 * 4) == (backend == "xnnpack")
    assert "memory.alloc" not in proc.stdout
