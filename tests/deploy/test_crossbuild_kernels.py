"""etlab's kernels (board/runner/src/kernels/) in the aarch64 cross build: the runner a Pi gets carries them with NEON
code and without the dot-product extension a Pi 4's Cortex-A72 lacks, and the kernel check built by the same cross
toolchain gives the PyTorch reference's answer under qemu. The cross build itself: test_crossbuild.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.deploy import crossbuild
from orchestrator.deploy.payload import fetch_wheel, tree_sha256
from orchestrator.paths import BOARD_SOURCE_DIR
from orchestrator.versions import executorch_version
from tests.board.test_kernels import (
    AttendCase,
    KernelCase,
    RmsNormCase,
    RopeCase,
    UpdateCase,
    assert_attention_close,
    run_check,
)
from tests.board.test_shared_head_kernel import assert_head_close, head_case
from tests.deploy.test_crossbuild import PI_FACTS, aarch64_compiler, elf_machine
from tests.plugins.runner import KERNEL_CHECK_NAME

# Armv8.2's dot-product (and Armv8.6's mixed-sign) instructions: a Pi 4 (Cortex-A72, Armv8.0) faults on them.
DOT_PRODUCT = re.compile(r"^\s*[0-9a-f]+:\s+(sdot|udot|usdot|sudot)\s", re.M)


def disassembly(binary: Path) -> str:
    objdump = shutil.which("aarch64-linux-gnu-objdump")
    if objdump is None:
        pytest.skip("no aarch64-linux-gnu-objdump (binutils-aarch64-linux-gnu)")
    done = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", "-C", str(binary)], capture_output=True, text=True, check=True
    )
    return done.stdout


def function_bodies(text: str, name_part: str) -> str:
    """The disassembly of every function whose (demangled) name contains `name_part`."""
    blocks = re.split(r"\n(?=[0-9a-f]+ <)", text)
    return "\n".join(block for block in blocks if name_part in block.split("\n", 1)[0])


def test_the_aarch64_runner_has_neon_kernels_and_no_dot_product_instructions() -> None:
    compiler = aarch64_compiler()
    wheel = fetch_wheel("executorch", f"executorch=={executorch_version()}", PI_FACTS, any_python=True)
    source = BOARD_SOURCE_DIR / "runner"
    binary = crossbuild.cross_build_runner(compiler, wheel, source, tree_sha256(source), executorch_version())
    assert elf_machine(binary) == "aarch64"
    assert b"etlab::attend.out" in binary.read_bytes() and b"etlab::update_cache.out" in binary.read_bytes()
    assert b"etlab::shared_head.out" in binary.read_bytes() and b"etlab::rope.out" in binary.read_bytes()
    assert b"etlab::rms_norm.out" in binary.read_bytes()
    text = disassembly(binary)
    rope = function_bodies(text, "rope_out")
    assert re.search(r"\sfmul\s+v\d+\.4s", rope), (
        "rope's loops are vectorized: products on 4 floats"
    )  # -O3, no intrinsics
    norm = function_bodies(text, "rms_norm_out") + function_bodies(text, "mean_of_squares")
    assert re.search(r"\sfmul\s+v\d+\.4s", norm), "rms_norm's loops are vectorized: products on 4 floats"
    attention = function_bodies(text, "neon::attend_row")
    assert re.search(r"\sfmla\s+v\d+\.4s", attention), "attend's NEON loops use fused multiply-add on 4 floats"
    head = function_bodies(text, "neon::head_row")
    assert re.search(r"\ssmull2?\s+v\d+\.8h", head) or re.search(r"\ssmlal2?\s+v\d+\.8h", head), "int8 products"
    assert not DOT_PRODUCT.findall(text), DOT_PRODUCT.findall(text)[:5]


def test_the_aarch64_kernels_equal_the_reference_under_qemu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = aarch64_compiler()
    wheel = fetch_wheel("executorch", f"executorch=={executorch_version()}", PI_FACTS, any_python=True)
    source = BOARD_SOURCE_DIR / "runner"
    with crossbuild.cross_built_runner(compiler, wheel, source, tree_sha256(source), executorch_version()) as runner:
        sdk = runner.parents[2] / "runtime" / executorch_version()  # the aarch64 SDK that build unpacked
        build = tmp_path / "build"
        build.mkdir()
        (build / "toolchain.cmake").write_text(crossbuild.toolchain_file(compiler, sdk))
        tools = str(Path(sys.executable).parent)  # the venv's cmake and ninja
        env = {**os.environ, "PATH": tools + os.pathsep + os.environ.get("PATH", "")}
        for argv in (
            ["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
             f"-DCMAKE_TOOLCHAIN_FILE={build / 'toolchain.cmake'}", f"-DEXECUTORCH_ROOT={sdk}",
             f"-DCMAKE_INSTALL_PREFIX={tmp_path / 'out'}", "-DETLAB_BUILD_KERNEL_CHECK=ON"],
            ["cmake", "--build", str(build), "--parallel", "2", "--target", KERNEL_CHECK_NAME],
        ):  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=900)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        check = build / KERNEL_CHECK_NAME
        assert elf_machine(check) == "aarch64"
        rng = np.random.default_rng(11)
        positions = rng.permutation(70)[:9].astype(np.int64)  # rows anywhere, past one block of 64
        query = rng.standard_normal((1, 6, 9, 17)).astype(np.float32)  # 3 query heads per KV head, an odd head dim
        key_cache, value_cache = rng.standard_normal((2, 1, 2, 70, 17)).astype(np.float32)
        value = rng.standard_normal((1, 2, 9, 17)).astype(np.float32)
        attend = AttendCase(query, key_cache, value_cache, positions, 17**-0.5)
        update = UpdateCase(value, key_cache, positions)
        # the tied head: 4-bit groups of 32 (the NEON loops), 8-bit rows, and groups of 34 (the plain loops)
        heads = {
            "shared_head.4bit": head_case(rng, (1, 2), 301, 96, 3, 4),
            "shared_head.8bit": head_case(rng, (1, 1), 77, 64, 1, 8),
            "shared_head.odd": head_case(rng, (3,), 9, 68, 2, 4),
        }
        angles = rng.uniform(-50, 50, (1, 5, 64)).astype(np.float32)
        rope = RopeCase(rng.standard_normal((1, 5, 3, 64)).astype(np.float32), np.cos(angles), np.sin(angles))
        norm = RmsNormCase(
            rng.standard_normal((5, 576)).astype(np.float32) * 3, rng.standard_normal(576).astype(np.float32), 1e-5
        )  # SmolLM2's width: lanes and no tail
        odd_norm = RmsNormCase(
            rng.standard_normal((2, 37)).astype(np.float32), rng.standard_normal(37).astype(np.float32), 1e-6
        )  # a tail after the lanes
        monkeypatch.setenv("QEMU_LD_PREFIX", "/usr/aarch64-linux-gnu")  # binfmt's qemu-aarch64 finds the loader
        for core in ("cortex-a72", "cortex-a76"):  # a Pi 4's core (no dot product: SIGILL if used) and a Pi 5's
            monkeypatch.setenv("QEMU_CPU", core)
            cases: dict[str, KernelCase] = {
                "attend.0": attend,
                "update_cache.0": update,
                "rope.0": rope,
                "rms_norm.0": norm,
                "rms_norm.odd": odd_norm,
                **heads,
            }
            outputs, line = run_check(check, tmp_path, cases, "--threads", "2")
            assert line["isa"] == line["shared_head_isa"] == "neon", core
            for name, case in heads.items():
                assert outputs[f"{name}.status"] == 0, (core, name)
                assert_head_close(outputs[f"{name}.out"], case)
            assert outputs["attend.0.status"] == 0 and outputs["update_cache.0.status"] == 0, core
            assert_attention_close(outputs["attend.0.out"], attend)
            np.testing.assert_array_equal(outputs["update_cache.0.cache"], update.reference())
            assert outputs["rope.0.status"] == 0, core
            np.testing.assert_allclose(outputs["rope.0.out"], rope.reference(), rtol=1e-6, atol=1e-5)
            for name, norm_case in (("rms_norm.0", norm), ("rms_norm.odd", odd_norm)):
                assert outputs[f"{name}.status"] == 0, (core, name)
                np.testing.assert_allclose(outputs[f"{name}.out"], norm_case.reference(), rtol=1e-5, atol=1e-5)
