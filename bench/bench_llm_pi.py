"""etlab's and llama.cpp's LLM decode and prefill against the board's roofline, on an EMULATED Raspberry Pi 5.

EMULATED: the Pi is orchestrator/testing/pi.py's (the arm64 rootfs's sshd under qemu-user, `QEMU_CPU=cortex-a76`,
so XNNPACK and llama.cpp take the Arm kernels a Pi 5 runs), on this x86 machine. qemu translates every instruction:
its tok/s and milliseconds are not a Pi's. Only the shares mean something, and only as the emulation's: each
engine's figures over the limits `setup-board` measured on the same emulated board (read bandwidth under its state's
"limits", fp32/int8 GEMM peaks under "compute"), with the same thread count.

- etlab: `fab deploy-and-profile --model smollm2-135m-gen --no-explore --quantize none|int8-dynamic|8da4w` against
  the board (its built-in prompt, `--new-tokens N`, one timed generation by default): its bundle's
  analysis/summary.json `generation.roofline` (bytes per decode step, achieved GB/s, share of the board's read
  bandwidth) and `generation.prefill_roofline` (XNNPACK's products over the prompt, their least time at the board's
  peaks and bandwidth, share = least / TTFT). The .pte files are those in artifacts/ (never lowered here: a missing
  one is waited for).
- llama.cpp: its `llama-bench` (the llama.cpp that llama-cpp-python 0.3.36 vendors), cross-built for aarch64 by
  bench/build_llama_cpp_aarch64.sh with aarch64-linux-gnu-g++ 12 (GGML_NATIVE=OFF,
  GGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16 (a Cortex-A76), OpenMP, repacking on, static), pushed to the board
  with the GGUF files of the same seeded random weights (bench_llm.py's f32, q8_0, q4_0) and run on it:
  `-p P -n 0` (prefill from an empty cache) and `-p 0 -n N -d P` (N decode steps after P tokens of context, as
  etlab's decode), flash attention off as bench_llm.py's "llama.cpp". Its KV cache is
  f16 for every scheme: llama-bench takes no f32 cache type (bench_llm.py's x86 table has f32 beside f32 weights;
  the difference is 1.7 MB of a step's 542). Bytes per token = its model size (llama-bench's `model_size`:
  llama_model_size) + the KV cache a step reads on average (llm_roofline.llama_kv_bytes_per_step over its N
  steps); its share = that x its decode tok/s over the board's bandwidth. Its prefill share = etlab's least prefill
  time on that scheme (the same products on the same weights) over llama.cpp's time for the P tokens.

    sudo nice -n 10 .venv/bin/python bench/bench_llm_pi.py [--schemes fp32,8bit,4bit] [--new-tokens 16]
        [--prompt-len 64] [--threads NPROC] [--llama-bench PATH] [--ggufs /tmp/llmbench] [--work /tmp/llmbench-pi]
        [--llama-python /work/peers/llama-cpp-0.3.36/bin/python] [--keep]

Threads: qemu-user runs the board's threads on the host's CPUs (the board's nproc; its fake /sys says 4 cores). On a
loaded 2-core host, 2 threads oversubscribe it, and llama.cpp's spinning barriers (hundreds per token) lose most:
its q4_0 decode ran 1.1 tok/s at 2 threads and 2.9 at 1 in the same emulation. `--threads 1` keeps both engines
and the probes off that artefact.

Needs root and what `./bootstrap.sh --test` installs (qemu-user-static, binfmt, the arm64 rootfs), and
aarch64-linux-gnu-g++ (the runner is cross-built on the workstation). --prompt-len must be etlab's built-in prompt
length for the model (64 for smollm2-135m-gen): deploy-and-profile takes that prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import llm_roofline  # noqa: E402
from bench.bench_llm import SCHEMES, Scheme  # noqa: E402
from bench.bench_numerics_pi import board_entry, fab  # noqa: E402
from orchestrator import console  # noqa: E402
from orchestrator.boards.inventory import Board  # noqa: E402
from orchestrator.boards.limits import recorded_bandwidth, recorded_compute  # noqa: E402
from orchestrator.deploy import crossbuild  # noqa: E402
from orchestrator.deploy.provision import setup_board  # noqa: E402
from orchestrator.testing.pi import start_pi_board  # noqa: E402
from orchestrator.testing.sshd import SshdLab  # noqa: E402
from orchestrator.transport import connect  # noqa: E402
from orchestrator.transport.base import BoardConnection  # noqa: E402
from orchestrator.transport.transfer import push_file  # noqa: E402

NETWORK = 54  # the lab's loopback range, 127.54.x.y: away from the suite's and bench_numerics_pi's labs
QUANTIZE = {"xnnpack": "none", "xnnpack-int8-dynamic": "int8-dynamic", "xnnpack-8da4w": "8da4w"}
LLAMA_BENCH = Path("/work/peers/llama-cpp-aarch64/build/bin/llama-bench")
LLAMA_PYTHON = Path("/work/peers/llama-cpp-0.3.36/bin/python")


@dataclass
class Row:
    """One engine on one scheme: what the table prints (None: not measured)."""

    scheme: str
    engine: str
    bytes_per_token: float | None = None
    decode_tok_s: float | None = None
    decode_share: float | None = None
    prefill_tok_s: float | None = None
    prefill_share: float | None = None
    note: str = ""


def write_inventory(path: Path, board: Board) -> Path:
    """The board alone, with its thread count (bench_numerics_pi.py's entry leaves `threads` out)."""
    import yaml

    entry = {**board_entry(board), "threads": board.threads}
    document = {"defaults": {"known_hosts": str(board.known_hosts)}, "boards": {board.name: entry}}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# --- llama.cpp's files ------------------------------------------------------------------------------------------


def gguf_files(model: str, kinds: set[str], found_in: Path, work: Path, llama_python: Path) -> dict[str, Path]:
    """The GGUF files of the seeded random weights: bench_llm.py's (in `found_in`) or an earlier run's (in `work`)
    when they are all there, else made in `work` by bench_llm.py's own functions (llama.cpp's converter and
    quantizer, the peer's llama_cpp)."""
    for folder in (found_in, work):
        wanted = {kind: folder / f"{model}-{kind}.gguf" for kind in kinds}
        if all(path.is_file() for path in wanted.values()) and (folder / f"{model}-hf" / "config.json").is_file():
            return wanted
    from bench import bench_llm
    from orchestrator.lowering.builtins import BUILTIN_SPECS

    bench_llm.use_peer(llama_python)
    work.mkdir(parents=True, exist_ok=True)
    module = bench_llm.generation_module(BUILTIN_SPECS[model])
    return bench_llm.gguf_files(module, model, kinds, work)


def model_config(model: str, ggufs: dict[str, Path]) -> Any:
    """The HuggingFace config beside the GGUF files (bench_llm.py saves the weights as a folder first): layers and
    KV heads for llama.cpp's KV cache bytes."""
    folder = next(iter(ggufs.values())).parent / f"{model}-hf"
    return SimpleNamespace(**json.loads((folder / "config.json").read_text()))


def llama_bench(conn: BoardConnection, binary: str, gguf: str, threads: int, args: argparse.Namespace,
                kv: str, prompt: int, gen: int, depth: int) -> dict[str, Any]:  # fmt: skip
    """One llama-bench test on the board (`-r 1`, JSON): its single result."""
    command = [binary, "-m", gguf, "-p", str(prompt), "-n", str(gen), "-d", str(depth), "-t", str(threads),
               "-r", str(args.repetitions), "-fa", args.flash_attn, "-ctk", kv, "-ctv", kv, "-o", "json"]  # fmt: skip
    done = conn.run(command, timeout=args.timeout)
    results = json.loads(done.stdout)
    assert len(results) == 1, f"llama-bench gave {len(results)} results for one test"
    return dict(results[0])


# --- etlab ------------------------------------------------------------------------------------------------------


def wait_for_artifact(model: str, variant: str, timeout: float) -> Path:
    """The lowered program in artifacts/ (another job may be lowering it: wait, never lower here)."""
    folder = Path(os.environ.get("ETLAB_ARTIFACTS", ROOT / "artifacts")) / model
    pte, sidecar = folder / f"{model}_{variant}.pte", folder / f"{model}_{variant}.json"
    deadline = time.monotonic() + timeout
    said = False
    while not (pte.is_file() and sidecar.is_file()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pte} not lowered after {timeout:.0f} s")
        if not said:
            print(f"  waiting for {pte.name} (lowered elsewhere)", flush=True)
            said = True
        time.sleep(15)
    return pte


def etlab_summary(results: Path, board: str, model: str, variant: str) -> dict[str, Any] | None:
    runs = sorted((results / board / model / variant).glob("*/analysis/summary.json"))
    return json.loads(runs[-1].read_text()) if runs else None


def etlab_row(scheme: Scheme, summary: dict[str, Any] | None, note: str) -> tuple[Row, float | None]:
    """etlab's row from its summary.json, and its least prefill time (ms) for llama.cpp's share."""
    row = Row(scheme.name, "etlab", note=note)
    generation = (summary or {}).get("generation") or {}
    decode, prefill = generation.get("roofline") or {}, generation.get("prefill_roofline") or {}
    row.bytes_per_token = decode.get("bytes_per_token")
    row.decode_tok_s = generation.get("decode_tokens_per_s")
    row.decode_share = decode.get("share")
    row.prefill_tok_s = generation.get("prefill_tokens_per_s")
    row.prefill_share = prefill.get("share")
    least = [value for value in (prefill.get("compute_ms"), prefill.get("memory_ms")) if value is not None]
    if decode.get("fits_in_cache"):
        row.note = (row.note + "; " if row.note else "") + "step fits the LLC"
    return row, max(least) if least else None


# --- the run ----------------------------------------------------------------------------------------------------


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-gen")
    parser.add_argument("--schemes", default="fp32,8bit,4bit", help="of bench_llm.py's fp32, 8bit, 4bit")
    parser.add_argument("--prompt-len", type=int, default=64, help="etlab's built-in prompt length (llama-bench -p)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=1, help="etlab's timed generations")
    parser.add_argument("--warmup", type=int, default=0, help="etlab's untimed generations")
    parser.add_argument("--repetitions", type=int, default=1, help="llama-bench -r")
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="both engines' and the probes' (default: the board's nproc, the host CPUs qemu-user runs on; a Pi 5 "
        "has 4 cores, but 4 threads on fewer host CPUs oversubscribe them)",
    )
    parser.add_argument("--flash-attn", default="off", choices=("off", "on", "auto"), help="llama-bench -fa")
    parser.add_argument("--llama-bench", type=Path, default=LLAMA_BENCH, help="llama-bench cross-built for aarch64")
    parser.add_argument("--ggufs", type=Path, default=Path("/tmp/llmbench"), help="bench_llm.py's GGUF files")
    parser.add_argument("--work", type=Path, default=Path("/tmp/llmbench-pi"), help="GGUFs made here if missing")
    parser.add_argument("--llama-python", type=Path, default=LLAMA_PYTHON, help="llama-cpp-python peer (quantizer)")
    parser.add_argument("--flavour", default="pi5")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per fab task or llama-bench test")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (results, inventory, lab)")
    args = parser.parse_args()
    schemes = [SCHEMES[name] for name in args.schemes.split(",") if name]
    if not args.llama_bench.is_file():
        raise SystemExit(f"no llama-bench at {args.llama_bench}: cross-build it for aarch64 first")
    if crossbuild.find_cross_compiler("aarch64") is None:
        raise SystemExit("aarch64-linux-gnu-g++ is missing: the runner is cross-built on the workstation")
    started = time.perf_counter()
    stages: list[tuple[str, float]] = []

    def stage(name: str, since: float) -> float:
        now = time.perf_counter()
        stages.append((name, now - since))
        print(f"  {name}: {now - since:.0f} s", flush=True)
        return now

    lap = time.perf_counter()
    ggufs = gguf_files(args.model, {s.gguf_type for s in schemes}, args.ggufs, args.work, args.llama_python)
    config = model_config(args.model, ggufs)
    lap = stage("GGUF files (" + ", ".join(f"{kind} {path}" for kind, path in ggufs.items()) + ")", lap)

    scratch = Path(tempfile.mkdtemp(prefix="etlab-bench-llm-pi-"))
    env = dict(os.environ)
    env.setdefault("ETLAB_RESULTS", str(scratch / "results"))
    env.setdefault("COLUMNS", "200")
    results = Path(env["ETLAB_RESULTS"])
    pi_name = f"{args.flavour}-emu"
    rows: list[Row] = []
    facts: dict[str, Any] = {}
    failures: list[str] = []
    lab = SshdLab(scratch / "lab", network=NETWORK)
    try:
        pi = start_pi_board(lab, pi_name, flavour=args.flavour, build="workstation", threads=args.threads)
        inventory = write_inventory(scratch / "inventory.yaml", pi.board)
        lap = stage("emulated Pi started", lap)
        with connect(pi.board) as conn:
            facts["getconf _NPROCESSORS_ONLN"] = conn.run(["getconf", "_NPROCESSORS_ONLN"]).stdout.strip()
            facts["nproc"] = conn.run(["nproc"]).stdout.strip()
            report = setup_board(conn)
            lap = stage(f"setup-board ({'; '.join(report.actions) or 'up to date'})", lap)
            state = json.loads(conn.run(["sh", "-c", "cat ~/.etlab/state.json"]).stdout)
            bandwidth = recorded_bandwidth(state, pi_name)
            peak = recorded_compute(state, pi_name)
            if bandwidth is None:
                raise SystemExit("setup-board recorded no read bandwidth on the emulated board")
            facts["bandwidth"] = f"{bandwidth.gb_per_s:.2f} GB/s at {bandwidth.threads} threads"
            facts["peaks"] = (f"fp32 {peak.fp32_gflops:.1f} GFLOP/s, int8 {peak.int8_gops:.1f} GOP/s at "
                              f"{peak.threads} threads" if peak else "not measured")  # fmt: skip

            least_ms: dict[str, float | None] = {}
            for scheme in schemes:
                assert scheme.variant is not None
                wait_for_artifact(args.model, scheme.variant, args.timeout)
                code, wall, said = fab("deploy-and-profile", "--model", args.model, "--board", pi_name,
                                       "--inventory", str(inventory), "--no-explore", "--backend", "xnnpack",
                                       "--quantize", QUANTIZE[scheme.variant], "--new-tokens", str(args.new_tokens),
                                       "--iterations", str(args.iterations), "--warmup", str(args.warmup),
                                       env=env, timeout=args.timeout)  # fmt: skip
                lap = stage(f"etlab {scheme.name}: deploy-and-profile exit {code} (fab {wall:.0f} s)", lap)
                if code not in (0, 1):  # 1: a gate (random weights); the bundle is there
                    print("    " + "\n    ".join(said.strip().splitlines()[-15:]), flush=True)
                summary = etlab_summary(results, pi_name, args.model, scheme.variant)
                row, least_ms[scheme.name] = etlab_row(scheme, summary, "" if summary else f"no bundle (exit {code})")
                if code not in (0, 1) or summary is None:
                    failures.append(f"etlab {scheme.name}: exit {code}: {said.strip()[-600:]}")
                rows.append(row)

            binary = push_file(conn, args.llama_bench, kind="bin", suffix="").remote_path
            conn.run(["chmod", "+x", binary])
            for scheme in schemes:
                row = Row(scheme.name, "llama.cpp")
                rows.append(row)
                remote = push_file(conn, ggufs[scheme.gguf_type], kind="models", suffix=".gguf").remote_path
                kv_type = 1  # f16: llama-bench takes no f32 cache type (-ctk f16, bf16 or quantized only)
                try:
                    prefill = llama_bench(conn, binary, remote, args.threads, args, "f16", args.prompt_len, 0, 0)
                    decode = llama_bench(conn, binary, remote, args.threads, args, "f16", 0, args.new_tokens,
                                         args.prompt_len)  # fmt: skip
                except Exception as exc:  # the row says what failed; the other schemes still run
                    row.note = "llama-bench failed (below)"
                    failures.append(f"llama.cpp {scheme.name}: {str(exc).strip()[-600:]}")
                    lap = stage(f"llama.cpp {scheme.name}: failed", lap)
                    continue
                # Its N decode steps after P tokens: the mean filled rows are P + (N + 1) / 2
                kv_bytes = llm_roofline.llama_kv_bytes_per_step(config, kv_type, args.prompt_len,
                                                                args.new_tokens + 1)  # fmt: skip
                row.bytes_per_token = float(decode["model_size"]) + kv_bytes
                row.decode_tok_s = float(decode["avg_ts"])
                row.decode_share = row.bytes_per_token * row.decode_tok_s / bandwidth.bytes_per_s
                row.prefill_tok_s = float(prefill["avg_ts"])
                least = least_ms.get(scheme.name)
                if least is not None:
                    row.prefill_share = least / (args.prompt_len / row.prefill_tok_s * 1000.0)
                row.note = f"KV {decode['type_k']}, size {int(decode['model_size']) / 1e6:.1f} MB"
                lap = stage(f"llama.cpp {scheme.name}: llama-bench pp{args.prompt_len} + tg{args.new_tokens}", lap)
    finally:
        lab.close()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    total = time.perf_counter() - started

    order = {scheme.name: index for index, scheme in enumerate(schemes)}
    rows.sort(key=lambda row: (order[row.scheme], row.engine != "etlab"))
    console.table(
        f"{args.model} on an EMULATED {args.flavour} (qemu-user, cortex-a76): shares only, the tok/s are qemu's, not "
        f"a Pi's. P={args.prompt_len}, N={args.new_tokens}, {args.threads} threads; the board's limits "
        f"(setup-board, emulated): {facts['bandwidth']}, {facts['peaks']}",
        ["scheme", "engine", "MB/token", "decode tok/s (emulated)", "% of board bandwidth",
         "prefill tok/s (emulated)", "% of prefill roofline", "note"],
        [[r.scheme, r.engine, num(r.bytes_per_token and r.bytes_per_token / 1e6, 1), num(r.decode_tok_s, 3),
          pct(r.decode_share), num(r.prefill_tok_s, 2), pct(r.prefill_share), r.note] for r in rows],
        caption="etlab: summary.json generation.roofline / prefill_roofline (its bytes/token: the weights once + its "
        "KV cache read per step); llama.cpp: llama-bench's model_size + its KV cache read per step (mean over its "
        "N steps after P tokens), x its tg tok/s over the board's bandwidth; its prefill: etlab's least prefill time "
        "for the scheme over llama-bench's pp time for P tokens",
    )  # fmt: skip
    for failure in failures:
        print(f"FAILED {failure}")
    print(f"board: getconf _NPROCESSORS_ONLN {facts.get('getconf _NPROCESSORS_ONLN')} (the fake /sys), nproc "
          f"{facts.get('nproc')} (the host's CPUs qemu-user runs on); {os.cpu_count()} host cores")  # fmt: skip
    print("stages: " + "; ".join(f"{name} {seconds:.0f} s" for name, seconds in stages))
    print(f"elapsed: {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
