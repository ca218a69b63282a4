"""etlab's ExecuTorch program against llama.cpp on the same language model: prefill and decode speed, per scheme.

Same weights (the spec's seeded random ones), same prompt ids, same thread count, greedy decoding, interleaved
round by round (etlab, llama.cpp, then llama.cpp, etlab, ...):
- etlab: the spec lowered by `lower()` (XNNPACK fp32; int8-dynamic and 8da4w where they lower), run by the
  native runner in `--generate` mode; its timings.json gives each generation's prefill and decode steps.
- llama.cpp: llama-cpp-python, either the one this interpreter imports (the `bench` extra) or a peer built apart
  (`--llama-python PEER/bin/python`: bench/build_llama_cpp.sh builds llama.cpp at its best here, repacked weights on
  and the AMX buffer type off, in a venv of its own; its build is printed and recorded). The same weights saved as a
  HuggingFace folder and converted by llama.cpp's own `convert_hf_to_gguf.py` (f32, f16, q8_0), then
  `llama_model_quantize` (Q4_0). Each scheme runs with flash attention off and on (`--flash-attn`), as two engines.
  Only `llama_decode` is timed: the prompt in one batch (prefill), then one token per step; the argmax is outside
  the timing, as in the runner.
- No hub here: the HuggingFace folder gets a small SentencePiece tokenizer trained offline; the converter pads the
  vocabulary to the config's `vocab_size` with unused tokens. The tokenizer is never used: both engines take ids.

TTFT is the prefill's time, prefill tok/s = P / TTFT, decode tok/s = (N - 1) / the decode steps' time, each the
median over the timed generations; ratios are etlab / llama.cpp (above 1: etlab faster for tok/s). Then etlab's
per-operator profile of a decode step (ETDump), and, with `--contexts`, etlab's memory and speed per KV-cache size.

    .venv/bin/python bench/bench_llm.py [--model smollm2-135m-gen] [--prompt-len 64] [--new-tokens 64]
        [--threads 2] [--rounds 5] [--generations 3] [--schemes fp32,fp16,8bit,4bit] [--etlab-schemes fp32]
        [--contexts 128,512,1024] [--llama-python PEER/bin/python] [--flash-attn off,on] [--repack all|float]
        [--attention etlab|sdpa] [--runner PATH] [--work /tmp/llmbench]
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from bench import llm_roofline  # noqa: E402
from orchestrator import console  # noqa: E402
from orchestrator.lowering.builtins import BUILTIN_SPECS  # noqa: E402
from orchestrator.lowering.rewrites.registry import NO_REWRITES, RewriteRequest, parse_rewrites  # noqa: E402
from orchestrator.lowering.spec import ModelSpec  # noqa: E402
from orchestrator.lowering.variants import Variant  # noqa: E402
from orchestrator.results.generation import GenerationTimings  # noqa: E402

ETLAB = "etlab"
FLASH_ATTN = {"off": "llama.cpp", "on": "llama.cpp FA"}  # --flash-attn choice -> the engine's name in the tables


@dataclass(frozen=True)
class Scheme:
    """One precision on both engines; `variant` None where etlab has no peer."""

    name: str
    variant: str | None  # etlab's variant
    gguf_type: str  # llama.cpp's weights
    kv_type: int  # llama.cpp's KV cache (ggml type): f32 beside fp32 weights, its default f16 otherwise


SCHEMES = {
    "fp32": Scheme("fp32", "xnnpack", "f32", 0),
    "fp16": Scheme("fp16", None, "f16", 1),  # etlab has no fp16 scheme: llama.cpp's figures alone
    "8bit": Scheme("8bit", "xnnpack-int8-dynamic", "q8_0", 1),  # int8 weights (per channel / blocks of 32)
    "4bit": Scheme("4bit", "xnnpack-8da4w", "q4_0", 1),  # int4 weights in groups, int8 activations on both
    # The LLM recipe's other group size; llama.cpp has no 128-block format, so Q4_0 (blocks of 32) is its peer too.
    "4bit-g128": Scheme("4bit-g128", "xnnpack-8da4w-g128", "q4_0", 1),
}


@dataclass
class Generations:
    """Timed generations of one engine and scheme: prefill ms, decode step ms, the ids."""

    prefill_ms: list[float] = dataclasses.field(default_factory=list)
    decode_ms: list[list[float]] = dataclasses.field(default_factory=list)
    token_ids: list[list[int]] = dataclasses.field(default_factory=list)

    def add(self, other: Generations) -> None:
        self.prefill_ms += other.prefill_ms
        self.decode_ms += other.decode_ms
        self.token_ids += other.token_ids

    def ttft_ms(self) -> float:
        return statistics.median(self.prefill_ms)

    def decode_tokens_per_s(self) -> float:
        return statistics.median(len(steps) / sum(steps) * 1000.0 for steps in self.decode_ms)


# --- the HuggingFace folder and llama.cpp's files ----------------------------------------------------------------


def generation_module(spec: ModelSpec) -> Any:
    """The spec's GenerationModule with the seeded random weights the lowering uses."""
    from orchestrator.lowering.sources.builders.models import load_model
    from orchestrator.lowering.sources.builders.torchvision import declare_torchvision_ops

    declare_torchvision_ops()  # before transformers is imported
    return load_model(spec, "random").module


def save_hf_folder(module: Any, folder: Path) -> None:
    """The weights as a HuggingFace folder, with a SentencePiece tokenizer made here (no hub): llama.cpp's converter
    needs one; it pads the vocabulary to `vocab_size` with unused tokens, so a small one does."""
    import io

    import sentencepiece

    if (folder / "tokenizer.model").is_file():
        return
    module.model.save_pretrained(folder)
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(3000)]
    lines = [" ".join(rng.choice(words, size=12)) for _ in range(4000)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=1000, model_type="bpe", byte_fallback=True,
        unk_id=3, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )  # fmt: skip
    (folder / "tokenizer.model").write_bytes(model.getvalue())


def llama_cpp_source(work: Path) -> Path:
    """llama.cpp's tree as the installed llama-cpp-python's sdist ships it (the converter and its gguf-py)."""
    from importlib.metadata import version

    release = version("llama-cpp-python")
    tree = work / f"llama_cpp_python-{release}" / "vendor" / "llama.cpp"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    sdist = work / f"llama_cpp_python-{release}.tar.gz"
    if not sdist.is_file():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", str(work),
             f"llama-cpp-python=={release}"],
            check=True, capture_output=True,
        )  # fmt: skip
    with tarfile.open(sdist) as archive:
        archive.extractall(work, filter="data")
    return tree


def gguf_files(module: Any, name: str, types: set[str], work: Path) -> dict[str, Path]:
    """The model as GGUF per type: f32 and f16 by llama.cpp's converter, q4_0 quantized from f32 by llama.cpp."""
    import llama_cpp

    hf_folder = work / f"{name}-hf"
    hf_folder.mkdir(parents=True, exist_ok=True)
    save_hf_folder(module, hf_folder)
    tree = llama_cpp_source(work)
    files = {kind: work / f"{name}-{kind}.gguf" for kind in types | {"f32"}}
    for kind in ("f32", "f16", "q8_0"):
        if kind in files and not files[kind].is_file():
            subprocess.run(
                [sys.executable, str(tree / "convert_hf_to_gguf.py"), str(hf_folder), "--outtype", kind,
                 "--outfile", str(files[kind])],
                env={"PYTHONPATH": str(tree / "gguf-py"), "PATH": "/usr/bin:/bin"}, check=True, capture_output=True,
            )  # fmt: skip
    if "q4_0" in files and not files["q4_0"].is_file():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
        params.nthread = 2
        status = llama_cpp.llama_model_quantize(
            str(files["f32"]).encode(), str(files["q4_0"]).encode(), ctypes.byref(params)
        )
        if status != 0:
            raise RuntimeError(f"llama_model_quantize failed ({status})")
    return files


class LlamaCpp:
    """One GGUF loaded once in llama-cpp-python; each generation clears the KV cache and times llama_decode only."""

    def __init__(
        self, gguf: Path, threads: int, context: int, kv_type: int, repack: bool = True, flash_attn: bool = False
    ) -> None:
        import llama_cpp
        import llama_cpp.llama as high_level

        self.llama_cpp = llama_cpp
        defaults = llama_cpp.llama_model_default_params

        def model_params() -> Any:
            params = defaults()
            params.use_extra_bufts = repack
            return params

        high_level.llama_cpp.llama_model_default_params = model_params  # Llama() takes no such argument
        try:
            self.model = llama_cpp.Llama(
                str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=context, n_batch=context,
                type_k=kv_type, type_v=kv_type, flash_attn=flash_attn, verbose=False,
            )  # fmt: skip
        finally:
            high_level.llama_cpp.llama_model_default_params = defaults
        self.n_vocab = self.model.n_vocab()

    def next_token(self) -> int:
        logits = self.llama_cpp.llama_get_logits_ith(self.model._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(self.n_vocab,))))

    def generate(self, prompt: list[int], new_tokens: int) -> tuple[float, list[float], list[int]]:
        self.model.reset()
        self.model._ctx.kv_cache_seq_rm(-1, 0, -1)  # before the clock: eval() would clear it inside the prefill
        started = time.perf_counter()
        self.model.eval(prompt)
        prefill_ms = (time.perf_counter() - started) * 1000.0
        tokens, steps = [self.next_token()], []
        for _ in range(new_tokens - 1):
            started = time.perf_counter()
            self.model.eval([tokens[-1]])
            steps.append((time.perf_counter() - started) * 1000.0)
            tokens.append(self.next_token())
        return prefill_ms, steps, tokens

    def run(self, prompt: list[int], new_tokens: int, warmup: int, generations: int) -> Generations:
        for _ in range(warmup):
            self.generate(prompt, new_tokens)
        result = Generations()
        for _ in range(generations):
            prefill_ms, steps, tokens = self.generate(prompt, new_tokens)
            result.add(Generations([prefill_ms], [steps], [tokens]))
        return result


def use_peer(python: Path) -> None:
    """Import llama_cpp from a peer's venv (bench/build_llama_cpp.sh): its site-packages go after this interpreter's
    own (same Python version), so llama_cpp and what only it needs come from the peer, the rest from etlab's .venv."""
    asked = "import sysconfig; paths = sysconfig.get_paths(); print(paths['purelib']); print(paths['platlib'])"
    done = subprocess.run([str(python), "-c", asked], capture_output=True, text=True, check=True)
    version = subprocess.run([str(python), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
    if version != str(sys.version_info[:2]):
        raise SystemExit(f"--llama-python is Python {version}, this interpreter {sys.version_info[:2]}: same needed")
    for path in dict.fromkeys(done.stdout.split()):
        if path not in sys.path:
            sys.path.append(path)


def llama_build(python: Path | None) -> str:
    """How the llama.cpp in use was built: the peer's build record (build_llama_cpp.sh) and llama.cpp's own CPU
    feature line (`AVX512 = 1 | ... | REPACK = 1 | AMX_INT8 = 0 | OPENMP = 1 ...`)."""
    import llama_cpp

    record = "llama-cpp-python as this interpreter imports it (the `bench` extra; pip's default build)"
    if python is not None:
        built = Path(python).parent.parent / "etlab-build.txt"
        record = built.read_text().strip() if built.is_file() else f"a peer at {python} (no etlab-build.txt)"
    system = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    return f"{record}\nllama_cpp {llama_cpp.__version__} from {Path(llama_cpp.__file__).parent}\n{system}"


# --- etlab ------------------------------------------------------------------------------------------------------


def lowered(
    spec: ModelSpec, variant: str, attention: str | None = None, rewrites: RewriteRequest = NO_REWRITES
) -> tuple[Path, int, int]:
    """The spec lowered (cached in artifacts/): the .pte, its KV cache's bytes and context."""
    from orchestrator.lowering.artifacts import load_artifact
    from orchestrator.lowering.export import lower as lowering
    from orchestrator.lowering.program import with_

    if attention is not None:  # `--attention etlab|sdpa`: the other program is lowered under its own name
        spec = with_(spec, attention=attention)
    spec = with_(spec, rewrites=rewrites)  # `--rewrites rope`: under its own name too (smollm2-135m-gen.rope)
    lowering.lower(spec, variants=[Variant.parse(variant)], weights="random", jobs=1, rewrites=rewrites)
    artifact = load_artifact(spec.name, Variant.parse(variant))
    generation = artifact.sidecar.generation
    assert generation is not None, "a text-generation program's sidecar records its KV cache"
    return artifact.pte, generation.kv_cache_bytes, generation.context


def local_board_runner() -> Path:
    """The runner `setup-board` built for the local board (provisioned if needed)."""
    from orchestrator.boards.inventory import load_inventory
    from orchestrator.deploy.provision import setup_board
    from orchestrator.transport import connect

    with connect(load_inventory().boards["local"]) as conn:
        setup_board(conn)
        return Path(json.loads(Path(conn.workdir, "state.json").read_text())["runner_path"])


def run_etlab(
    runner: Path, pte: Path, prompt_file: Path, args: argparse.Namespace, work: Path, etdump: Path | None = None
) -> tuple[Generations, dict[str, Any]]:
    timings = work / "timings.json"
    command = [
        str(runner), "--model", str(pte), "--inputs", str(prompt_file), "--threads", str(args.threads),
        "--generate", "--new-tokens", str(args.new_tokens), "--warmup", str(args.warmup),
        "--iterations", str(args.generations), "--timings", str(timings),
    ]  # fmt: skip
    if etdump is not None:
        command += ["--etdump", str(etdump)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"runner failed ({completed.returncode}): {completed.stderr.strip().splitlines()[-1:]}")
    data = json.loads(timings.read_text())
    record = GenerationTimings.from_timings(data)
    assert record is not None, "a --generate run records its generations"
    result = Generations()
    for run in record.timed:
        result.add(Generations([run.prefill_ms], [list(run.decode_ms)], [list(run.token_ids)]))
    return result, data


def decode_profile(runner: Path, pte: Path, prompt_file: Path, args: argparse.Namespace, work: Path) -> None:
    """etlab's decode steps per operator (ETDump): where a step's time goes, and the share outside XNNPACK."""
    from orchestrator.programs.plan import read_program_plan
    from orchestrator.results.etdump import read_etdump
    from orchestrator.results.etdump_profile import _method_totals, inferred_ns_per_tick, profile_etdump
    from orchestrator.results.generation import DECODE, PREFILL, phase_etdump

    etdump_path = work / "decode.etdp"
    _, timings = run_etlab(runner, pte, prompt_file, args, work, etdump=etdump_path)
    record = GenerationTimings.from_timings(timings)
    assert record is not None
    etdump = read_etdump(etdump_path)
    blocks = record.phase_blocks(etdump.execute_blocks)
    plan = read_program_plan(pte)
    for phase in (PREFILL, DECODE):
        ns_per_tick, agreement = inferred_ns_per_tick(_method_totals(blocks[phase]), record.phase_times(phase))
        profile = profile_etdump(phase_etdump(etdump, blocks[phase]), plan, ns_per_tick=ns_per_tick)
        total = profile.total.mean if profile.total else float("nan")
        kernels = [i for i in profile.instructions if i.kind != "DelegateCall" and i.dist]
        delegates = [i for i in profile.instructions if i.kind == "DelegateCall" and i.dist]
        outside = sum(i.dist.mean for i in kernels if i.dist)
        inside = sum(i.dist.mean for i in delegates if i.dist)
        by_op: dict[str, list[float]] = {}
        for instruction in kernels:
            by_op.setdefault(instruction.op or instruction.label, []).append(instruction.dist.mean)  # type: ignore[union-attr]
        rows: list[list[Any]] = [
            [f"XNNPACK {row['type']}", row["count"], row["mean_ms"], row["pct"]] for row in profile.operator_types
        ]
        rows += [[f"outside: {op}", len(means), sum(means), sum(means) / total * 100.0] for op, means in by_op.items()]
        rows.sort(key=lambda row: -(row[2] or 0.0))
        console.table(
            f"etlab {pte.stem}, one {phase} execution ({profile.executions} timed, ETDump/timings "
            f"{agreement or float('nan'):.2f}): {total:.2f} ms; delegate calls {inside:.2f} ms "
            f"({inside / total * 100:.1f}%), kernels outside XNNPACK {outside:.2f} ms ({outside / total * 100:.1f}%)",
            ["operator", "count", "mean ms", "% of step"],
            rows[: args.top],
        )


# --- the run ----------------------------------------------------------------------------------------------------


def hf_greedy(module: Any, prompt: np.ndarray, new_tokens: int, spec: ModelSpec) -> list[int]:
    """Eager greedy ids from `prompt`: the lowering's reference when it is the same generation (it took minutes)."""
    from orchestrator.lowering.artifacts import ArtifactPaths
    from orchestrator.lowering.export.generation import greedy_ids
    from orchestrator.tensorfile import read_tensors

    paths = ArtifactPaths.for_model(spec.name)
    if (spec.seq_len, spec.new_tokens) == (prompt.shape[1], new_tokens) and paths.reference_outputs.is_file():
        saved_prompt, saved_ids = read_tensors(paths.reference_inputs)[0], read_tensors(paths.reference_outputs)[0]
        if np.array_equal(saved_prompt.array, prompt):
            return saved_ids.array.reshape(-1).tolist()
    return greedy_ids(module, prompt, new_tokens)[0].tolist()


def agreement(ids: list[int], reference: list[int]) -> str:
    equal = [a == b for a, b in zip(ids, reference, strict=False)]
    first = equal.index(False) if False in equal else None
    return f"{sum(equal)}/{len(equal)}" + (f", first difference at {first}" if first is not None else "")


def peak_rss_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024


def llama_cpp_memory(gguf: Path, context: int, args: argparse.Namespace) -> dict[str, Any]:
    """llama.cpp's peak RSS after one generation, in a child process of its own (this one holds torch)."""
    command = [sys.executable, __file__, "--llama-memory", str(gguf), "--llama-context", str(context),
               "--threads", str(args.threads), "--prompt-len", str(args.prompt_len),
               "--new-tokens", str(args.new_tokens)]  # fmt: skip
    if args.llama_python:
        command += ["--llama-python", str(args.llama_python)]
    completed = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def llama_memory_child(args: argparse.Namespace) -> int:
    """The child of llama_cpp_memory: the interpreter's own peak first, then the peak after a generation."""
    import re

    if args.llama_python:
        use_peer(args.llama_python)
    import llama_cpp  # before the baseline: its library is part of any llama.cpp process

    baseline = peak_rss_bytes()
    log: list[str] = []
    callback = llama_cpp.llama_log_callback(lambda _level, text, _data: log.append(text.decode(errors="replace")))
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))  # llama.cpp states its KV cache's size in its log
    engine = LlamaCpp(Path(args.llama_memory), args.threads, args.llama_context, 0)
    prompt = list(range(1000, 1000 + args.prompt_len))
    engine.generate(prompt, args.new_tokens)
    sizes = re.findall(r"llama_kv_cache: size =\s*([\d.]+) MiB", "".join(log))
    kv_mib = float(sizes[-1]) if sizes else None
    print(json.dumps({"baseline_bytes": baseline, "peak_rss_bytes": peak_rss_bytes(), "kv_cache_mib": kv_mib}))
    del engine  # freed while the log callback is alive: llama.cpp logs its teardown through it
    return 0


def memory_per_context(
    spec: ModelSpec, runner: Path, prompt_file: Path, args: argparse.Namespace, work: Path, gguf: Path
) -> None:
    """etlab fp32 at each KV-cache size: peak RSS per phase, the cache's bytes, TTFT and decode tok/s; and
    llama.cpp's f32 peak RSS and KV cache at the same size."""
    rows = []
    for context in args.contexts:
        sized = dataclasses.replace(spec, name=f"{spec.name}-ctx{context}", context=context)
        pte, kv_bytes, _ = lowered(sized, "xnnpack", args.attention, args.rewrites)
        result, timings = run_etlab(runner, pte, prompt_file, args, work)
        phases = {phase["phase"]: phase for phase in timings["memory"]["phases"]}
        peak = max(phase["peak_rss_bytes"] for phase in phases.values())
        theirs = llama_cpp_memory(gguf, context, args)
        rows.append([
            context, kv_bytes / 2**20, phases["first_execution"]["peak_rss_bytes"] / 2**20,
            phases.get("decode", {}).get("peak_rss_bytes", 0) / 2**20, peak / 2**20, pte.stat().st_size / 2**20,
            result.ttft_ms(), result.decode_tokens_per_s(), theirs["kv_cache_mib"],
            theirs["peak_rss_bytes"] / 2**20, (theirs["peak_rss_bytes"] - theirs["baseline_bytes"]) / 2**20,
        ])  # fmt: skip
    console.table(
        f"etlab fp32 XNNPACK per context (P={args.prompt_len}, N={args.new_tokens}, {args.threads} threads, "
        f"{args.generations} generations)",
        ["context", "KV cache MiB", "prefill peak RSS MiB", "decode peak RSS MiB", "peak RSS MiB", ".pte MiB",
         "TTFT ms", "decode tok/s", "llama.cpp KV MiB", "llama.cpp peak RSS MiB", "less its interpreter MiB"],
        rows,
        caption="llama.cpp: f32 weights and f32 KV cache, in a Python child process (its baseline: the interpreter "
        "and llama_cpp imported)",
    )  # fmt: skip


@dataclass(frozen=True)
class RoundBandwidth:
    """Each engine's (TTFT ms, decode tok/s) per round, and the DRAM bandwidth probed before the first round and
    after each (B/s)."""

    per_round: dict[tuple[str, str], list[tuple[float, float]]]
    probes: list[float]

    def median_share(self, key: tuple[str, str], bytes_per_token: float) -> float | None:
        """The median over the rounds of the round's decode bytes/s against the higher of the two probes around
        it (where the mode changed within the round, the lower share)."""
        rounds = self.per_round.get(key, [])
        if not rounds or len(self.probes) < len(rounds) + 1:
            return None
        return statistics.median(bytes_per_token * tok_s / max(self.probes[i], self.probes[i + 1]) * 100
                                 for i, (_, tok_s) in enumerate(rounds))  # fmt: skip


def roofline_table(results: dict[tuple[str, str], Generations], schemes: list[Scheme], programs: dict[str, Any],
                   engines: dict[tuple[str, str], Any], spec: ModelSpec, config: Any, args: argparse.Namespace,
                   runner: Path, *measured: llm_roofline.Limits, rounds: RoundBandwidth) -> None:  # fmt: skip
    """Each engine's decode and prefill against this machine's limits, measured before and after the rounds (the
    higher of each: the least disturbed), and its decode per round against the bandwidth probed around that round."""
    from orchestrator.lowering.artifacts import load_artifact

    limits = llm_roofline.Limits(max((m.dram for m in measured), key=lambda b: b.bytes_per_s),
                                 max((m.peak for m in measured), key=lambda p: p.fp32_flops_per_s))  # fmt: skip
    for when, m in zip(("before", "after"), measured, strict=True):
        console.info(f"limits {when} the rounds: {m.dram.gb_per_s:.1f} GB/s, fp32 {m.peak.fp32_gflops:.0f} GFLOP/s, "
                     f"int8 {m.peak.int8_gops:.0f} GOP/s")  # fmt: skip
    at_set: dict[int, float] = {}
    rows = []
    for scheme in schemes:
        ops: float | None = None  # etlab's (its engine comes first): the same products on the same weights
        least: float | None = None
        for (scheme_name, engine), got in results.items():
            if scheme_name != scheme.name or not got.prefill_ms:
                continue
            figures = llm_roofline.figures(args.prompt_len, args.new_tokens, spec.cache_capacity, got.ttft_ms(),
                                           got.decode_tokens_per_s())  # fmt: skip
            if engine == ETLAB:
                assert scheme.variant is not None
                artifact = load_artifact(spec.name, Variant.parse(scheme.variant))
                decode, prefill = llm_roofline.etlab_rooflines(figures, artifact.sidecar, artifact.pte, limits,
                                                               args.threads)  # fmt: skip
                assert decode is not None and prefill is not None
                per_token, ops = decode.bytes_per_token, prefill.ops / 1e9
                least = prefill.memory_ms if prefill.bound == "memory" else prefill.compute_ms
            else:
                size = engines[(scheme.name, engine)].model._model.size()
                per_token = size + llm_roofline.llama_kv_bytes_per_step(config, scheme.kv_type, args.prompt_len,
                                                                        args.new_tokens)  # fmt: skip
            if per_token not in at_set:
                at_set[per_token] = llm_roofline.bandwidth(runner, args.threads, per_token).bytes_per_s
            achieved = per_token * got.decode_tokens_per_s()
            ttft = got.ttft_ms()
            rows.append([
                scheme.name, engine, per_token / 1e6, figures.decode_tokens_per_s, achieved / 1e9,
                achieved / limits.dram.bytes_per_s * 100, rounds.median_share((scheme.name, engine), per_token),
                at_set[per_token] / 1e9, achieved / at_set[per_token] * 100,
                ops, ttft, least, least / ttft * 100 if least is not None else None,
            ])  # fmt: skip
    llm_roofline.roofline_rows(rows, limits, at_set)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-gen", help="a built-in text-generation spec")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--generations", type=int, default=3, help="timed generations per engine per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed generations per engine per round")
    parser.add_argument("--schemes", default="fp32,fp16,8bit,4bit", help=f"from {','.join(SCHEMES)}")
    parser.add_argument(
        "--etlab-schemes", default="fp32,8bit,4bit", help="the schemes etlab lowers; the others: llama.cpp alone"
    )
    parser.add_argument("--contexts", default="", help="KV-cache sizes for etlab's memory table, e.g. 128,512,1024")
    parser.add_argument("--top", type=int, default=12, help="operators shown per phase profile")
    parser.add_argument("--runner", type=Path, help="an etlab_runner with --generate (default: the local board's)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/llmbench"), help="GGUF files and scratch")
    parser.add_argument(
        "--llama-python", type=Path, help="the Python of a llama-cpp-python peer built apart (bench/build_llama_cpp.sh)"
    )
    parser.add_argument("--flash-attn", default="off,on", help="llama.cpp's flash attention: off, on or both")
    parser.add_argument(
        "--repack",
        choices=("all", "float"),
        default="all",
        help="llama.cpp's repacked weights (extra buffer types) for every type, or for f32/f16 only "
        "(pip's default build crashed repacking q8_0/Q4_0 for AMX on an Intel VM)",
    )
    parser.add_argument(
        "--attention",
        choices=("etlab", "sdpa"),
        help="etlab's attention lowering: etlab (its own operators, the default) or sdpa (standard operators)",
    )
    parser.add_argument(
        "--rewrites", default="none", help="etlab's programs with these rewrites (`fab lower --rewrites`), e.g. rope"
    )
    parser.add_argument("--llama-memory", help=argparse.SUPPRESS)  # the child of llama_cpp_memory
    parser.add_argument("--llama-context", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.llama_python:
        use_peer(args.llama_python)
    if args.llama_memory:
        return llama_memory_child(args)
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    args.rewrites = parse_rewrites(args.rewrites)  # once, at the edge: an unknown name stops before any lowering
    schemes = [SCHEMES[name] for name in args.schemes.split(",")]
    peers = [FLASH_ATTN[choice] for choice in args.flash_attn.split(",")]
    engine_names = (ETLAB, *peers)

    console.quiet_third_party()
    build = llama_build(args.llama_python)
    console.info(f"llama.cpp's build:\n{build}")
    timer = console.StageTimer()
    spec = BUILTIN_SPECS[args.model]
    if args.prompt_len + args.new_tokens > spec.cache_capacity:  # the prompt length alone needs no new program
        wanted = args.prompt_len + args.new_tokens
        spec = dataclasses.replace(spec, name=f"{spec.name}-ctx{wanted}", context=wanted)
    args.work.mkdir(parents=True, exist_ok=True)
    from orchestrator.lowering.export.generation import prompt_ids
    from orchestrator.tensorfile import NamedTensor, write_tensors

    with timer.stage(f"{args.model}: the seeded random weights"):
        module = generation_module(spec)
    vocab = int(module.model.config.vocab_size)
    prompt = prompt_ids(args.prompt_len, vocab)
    prompt_file = args.work / f"{spec.name}-prompt.etlt"
    write_tensors(prompt_file, [NamedTensor("input_ids", prompt)])
    with timer.stage("llama.cpp: HF folder, convert_hf_to_gguf.py, llama_model_quantize"):
        ggufs = gguf_files(module, args.model, {scheme.gguf_type for scheme in schemes}, args.work)
    programs = {}
    for scheme in schemes:
        if scheme.variant and scheme.name in args.etlab_schemes.split(","):
            try:
                with timer.stage(f"etlab: lower {scheme.variant} (cached in artifacts/)"):
                    programs[scheme.name] = lowered(spec, scheme.variant, args.attention, args.rewrites)
            except Exception as exc:  # a scheme etlab cannot lower yet: llama.cpp's figures alone
                console.warn(f"etlab cannot lower {scheme.variant}: {str(exc).splitlines()[0]}")
    context = spec.cache_capacity
    with timer.stage("the native runner"):
        runner = args.runner or local_board_runner()
    with timer.stage("HuggingFace eager greedy ids (the reference)"):
        reference = hf_greedy(module, prompt, args.new_tokens, spec)
    config = module.model.config
    del module
    with timer.stage("this machine's limits (etlab's probes: read bandwidth, fp32 and int8 GEMM)"):
        limits_before = llm_roofline.measure(runner, args.threads, args.work)

    # `--repack float`: quantized weights repacked for the CPU's extra buffer types crashed in pip's default build on
    # an Intel VM (AMX int8; general protection fault in the first decode), so they ran unrepacked, llama.cpp's
    # slower path for them. build_llama_cpp.sh's peer has no AMX buffer type and repacks everything (`all`).
    engines = {
        (s.name, name): LlamaCpp(
            ggufs[s.gguf_type], args.threads, context, s.kv_type,
            repack=args.repack == "all" or s.gguf_type in ("f32", "f16"), flash_attn=name == FLASH_ATTN["on"],
        )
        for s in schemes for name in peers
    }  # fmt: skip
    results = {(s.name, engine): Generations() for s in schemes for engine in engine_names}
    per_round: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in results}
    # The DRAM probe between rounds too: a VM's bandwidth can change mode within a run (bench/README.md), so each
    # round's decode is also put against the bandwidth measured next to it.
    between_rounds = [limits_before.dram.bytes_per_s]
    for round_index in range(args.rounds):
        for scheme in schemes:
            order = engine_names if round_index % 2 == 0 else engine_names[::-1]
            for engine in order:
                if engine == ETLAB and scheme.name not in programs:
                    continue
                with timer.stage(f"round {round_index + 1} {scheme.name} {engine}", quiet=True):
                    if engine == ETLAB:
                        got, _ = run_etlab(runner, programs[scheme.name][0], prompt_file, args, args.work)
                    else:
                        got = engines[(scheme.name, engine)].run(
                            prompt[0].tolist(), args.new_tokens, args.warmup, args.generations
                        )
                results[(scheme.name, engine)].add(got)
                per_round[(scheme.name, engine)].append((got.ttft_ms(), got.decode_tokens_per_s()))
        between_rounds.append(llm_roofline.bandwidth(runner, args.threads).bytes_per_s)
        console.info(f"round {round_index + 1}/{args.rounds} done ({between_rounds[-1] / 1e9:.1f} GB/s after it)")

    rows = []
    for (scheme_name, engine), got in results.items():
        if not got.prefill_ms:
            continue
        ttft = got.ttft_ms()
        ids = got.token_ids[-1]
        rows.append([
            scheme_name, engine, len(got.prefill_ms), ttft, args.prompt_len / ttft * 1000.0,
            got.decode_tokens_per_s(), statistics.median(s for steps in got.decode_ms for s in steps),
            agreement(ids, reference), len(set(map(tuple, got.token_ids))),
        ])  # fmt: skip
    console.table(
        f"{args.model}: P={args.prompt_len} prompt tokens, N={args.new_tokens} new, {args.threads} threads, "
        f"context {context}, {args.rounds} rounds x {args.generations} generations (+{args.warmup} warmup); "
        f"etlab attention: {args.attention or 'the lowering default'}; llama.cpp FA: flash attention on",
        ["scheme", "engine", "gens", "TTFT ms", "prefill tok/s", "decode tok/s", "step ms", "ids = HF eager",
         "distinct id runs"],
        rows,
        caption=f"llama.cpp's build: {build}",
    )  # fmt: skip
    ratio_rows = []
    for scheme, peer in ((scheme, peer) for scheme in schemes for peer in peers):
        ours, theirs = results[(scheme.name, ETLAB)], results[(scheme.name, peer)]
        if not ours.prefill_ms:
            continue
        paired = list(zip(per_round[(scheme.name, ETLAB)], per_round[(scheme.name, peer)], strict=True))
        ratio_rows.append([
            scheme.name, peer,
            theirs.ttft_ms() / ours.ttft_ms(), statistics.median(b[0] / a[0] for a, b in paired),
            ours.decode_tokens_per_s() / theirs.decode_tokens_per_s(),
            statistics.median(a[1] / b[1] for a, b in paired),
        ])  # fmt: skip
    console.table(
        "etlab / llama.cpp speed (prefill: llama.cpp TTFT / etlab TTFT; above 1: etlab faster)",
        ["scheme", "against", "prefill, of medians", "prefill, per-round", "decode, of medians", "decode, per-round"],
        ratio_rows,
    )

    with timer.stage("this machine's limits again, after the rounds"):
        limits_after = llm_roofline.measure(runner, args.threads, args.work)
    roofline_table(results, schemes, programs, engines, spec, config, args, runner, limits_before, limits_after,
                   rounds=RoundBandwidth(per_round, between_rounds))  # fmt: skip
    for scheme in schemes:
        if scheme.name in programs:
            decode_profile(runner, programs[scheme.name][0], prompt_file, args, args.work)
    if args.contexts:
        memory_per_context(spec, runner, prompt_file, args, args.work, ggufs["f32"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
