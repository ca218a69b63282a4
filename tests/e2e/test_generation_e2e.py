"""Language models as they are used, end to end on the local board: `fab deploy-and-profile` of a text-generation
model lowers one program for prefill and decode, the runner generates token by token, and the analysis reports time
to first token, decode speed and memory per phase; the ids equal eager HuggingFace greedy generation, and the
prefill and decode overlays carry only node ids Model Explorer draws. Bad `--new-tokens` are refused with exit 64
before anything is pushed or run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.paths import PROJECT_ROOT
from orchestrator.tensorfile import read_tensors
from tests.plugins.analysis import adapter_graphs
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory

PHASE_OVERLAYS = [f"me_overlay_{phase}_{metric}.json" for phase in ("prefill", "decode")
                  for metric in ("median_ms", "mean_ms", "pct")]  # fmt: skip


def fab(tmp_path: Path, board: Board, artifacts: Path, *args: str) -> subprocess.CompletedProcess[str]:
    inventory = write_inventory(tmp_path / "inventory.yaml", [board])
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts), "ETLAB_RESULTS": str(tmp_path / "results"),
           "ETLAB_WIDTH": "400"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args, "--board", "local", "--inventory", str(inventory)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def generation_artifacts() -> Path:
    """The shared test cache: each generation program is lowered once per session (and kept across sessions)."""
    return ARTIFACT_CACHE


@pytest.mark.parametrize("model", ["smollm2-gen-tiny", "gpt2-gen-tiny"])
def test_a_language_model_generates_what_eager_greedy_does_and_is_profiled_per_phase(
    local_board: Board, tmp_path: Path, generation_artifacts: Path, model: str
) -> None:
    proc = fab(tmp_path, local_board, generation_artifacts, "deploy-and-profile", "--model", model, "--backend",
               "xnnpack", "--weights", "random", "--iterations", "3", "--warmup", "1", "--no-explore",
               "--counters=task_clock")  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    (run,) = [m.parent for m in (tmp_path / "results").glob(f"local/{model}/xnnpack/*/result_manifest.json")]
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    generation = summary["generation"]
    assert (generation["prompt_len"], generation["new_tokens"], generation["context"]) == (8, 8, 64)
    assert generation["generations"] == 3
    assert generation["tokens"] == {"compared": 8, "matching": 8, "agreement": 1.0, "first_divergence": None,
                                    "reference_tokens": 8}  # fmt: skip
    assert summary["correctness"]["ok"] is True
    assert generation["ttft_ms"] > 0 and generation["decode_tokens_per_s"] > 0
    assert generation["kv_cache_bytes"] > 0
    assert generation["memory"]["prefill"] > 0 and generation["memory"]["decode"] > 0
    (ran,) = read_tensors(run / "outputs.etlt")
    (reference,) = read_tensors(generation_artifacts / model / f"{model}_reference_outputs.etlt")
    assert ran.array.tolist() == reference.array.tolist()
    assert "Generation" in said and "= eager (8)" in said
    # the decode against the board's memory roofline (setup-board measured the local board's read bandwidth)
    roofline = generation["roofline"]
    assert roofline["bytes_per_token"] == roofline["weights_bytes"] + roofline["kv_bytes_per_token"] > 0
    assert roofline["bandwidth_gb_per_s"] > 0 and roofline["note"] is None
    assert roofline["share"] == pytest.approx(roofline["achieved_gb_per_s"] / roofline["bandwidth_gb_per_s"])
    assert roofline["achieved_gb_per_s"] == pytest.approx(
        roofline["bytes_per_token"] * generation["decode_tokens_per_s"] / 1e9
    )
    assert f"{roofline['share']:.0%} of {roofline['bandwidth_gb_per_s']:.1f} GB/s" in " ".join(said.split())
    # and where the decode step's time went, from its own profile: the products, the kernels outside the delegates
    # (etlab's attention among them), and the rest
    decode_profile = json.loads((run / "analysis" / "ops_decode.json").read_text())
    matmuls = ("XNNFullyConnected", "XNNBatchMatrixMultiply")
    products = [n["median_ms"] for d in decode_profile["delegates"] for n in d["nodes"]
                if n["type"] in matmuls and n["median_ms"] is not None]  # fmt: skip
    assert roofline["kernels_ms"] == pytest.approx(sum(products)) and roofline["kernels_ms"] > 0
    outside = [i["median_ms"] for i in decode_profile["instructions"] if i["kind"] == "KernelCall" and i["median_ms"]]
    assert roofline["outside_ms"] == pytest.approx(sum(outside)) and roofline["outside_ms"] > 0
    assert 0 < roofline["kernels_ms"] < roofline["profiled_step_ms"]
    # and what the rest is made of, per step: calls and operators
    called = [d for d in decode_profile["delegates"] if d["call_mean_ms"] is not None]
    assert roofline["delegate_calls"] == len(called) > 0
    assert roofline["kernel_calls"] == sum(
        1 for i in decode_profile["instructions"] if i["kind"] == "KernelCall" and i["median_ms"] is not None
    )
    called_products = sum(1 for d in called for n in d["nodes"] if n["type"] in matmuls and n["median_ms"] is not None)
    assert roofline["other_operators"] == sum(len(d["events"]) for d in called) - called_products > 0
    env = {**os.environ, "ETLAB_ARTIFACTS": str(generation_artifacts), "ETLAB_RESULTS": str(tmp_path / "results"),
           "ETLAB_WIDTH": "400"}  # fmt: skip
    analyzed = subprocess.run([sys.executable, "-m", "fabric", "analyze", "--run", run.name], cwd=PROJECT_ROOT,
                              env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert analyzed.returncode == 0, analyzed.stdout + analyzed.stderr
    lines = (analyzed.stdout + analyzed.stderr).splitlines()
    line = next(x.strip() for x in lines if x.strip().startswith("decode roofline: "))
    assert line.startswith(f"decode roofline: {roofline['bytes_per_token'] / 1e6:.1f} MB a step at "), line
    assert f"in the profiled {roofline['profiled_step_ms']:.3g} ms step the matrix products took" in line, line
    assert f"in {roofline['delegate_calls']} calls and {roofline['other_operators']} other operators" in line, line
    # the prefill's matrix products against the board's peak (and bandwidth): the least time they allow over TTFT
    prefill_line = generation["prefill_roofline"]
    assert prefill_line["ops"] > 0 and prefill_line["calls"] == 1 and prefill_line["note"] is None
    assert prefill_line["bound"] in ("compute", "memory") and prefill_line["compute_ms"] > 0
    least = prefill_line["compute_ms"] if prefill_line["bound"] == "compute" else prefill_line["memory_ms"]
    assert prefill_line["share"] == pytest.approx(least / generation["ttft_ms"])
    shown = f"{prefill_line['share']:.0%} of {'peak' if prefill_line['bound'] == 'compute' else 'bandwidth'}"
    assert f"prefill {shown}" in " ".join(said.split())
    counters = summary["counters"]  # one decode step's counts, as ops.json: the 3 timed generations' 7 steps each
    if "task_clock" in counters["captured"]:
        assert counters["executions"] == 3 * 7, counters
    else:  # a machine that refuses perf events says why, by name
        assert [m["name"] for m in counters["missing"]] == ["task_clock"], counters

    # Per phase: ops files of their own, and overlays whose every node is one Model Explorer draws.
    prefill = json.loads((run / "analysis" / "ops_prefill.json").read_text())
    decode = json.loads((run / "analysis" / "ops_decode.json").read_text())
    assert prefill["instructions"] and decode["instructions"]
    graphs = adapter_graphs(generation_artifacts / model / f"{model}_xnnpack.pte")
    index = json.loads((run / "model_explorer" / "overlays.json").read_text())
    for name in PHASE_OVERLAYS:
        assert name in index["metrics"].values()
        document = json.loads((run / "model_explorer" / name).read_text())
        assert "forward" in document and any("::" in graph for graph in document), name  # inside the delegates
        for graph_id, data in document.items():
            assert graph_id in graphs and data["results"]
            assert set(data["results"]) <= graphs[graph_id], f"{name}: {graph_id} has nodes the adapter lacks"
    # A prefill step processes 8 tokens, a decode step one: the prefill's measured time is the larger.
    assert sum(i["mean_ms"] or 0 for i in prefill["instructions"]) > 0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--new-tokens", "57"], "need 65 positions; its KV cache holds 64"),
        (["--new-tokens", "0"], "--new-tokens"),
        (["--new-tokens", "lots"], "--new-tokens"),
    ],
)
def test_new_tokens_beyond_the_cache_are_refused_before_anything_runs(
    local_board: Board, tmp_path: Path, generation_artifacts: Path, args: list[str], words: str
) -> None:
    proc = fab(tmp_path, local_board, generation_artifacts, "deploy-and-profile", "--model", "smollm2-gen-tiny",
               "--backend", "xnnpack", "--weights", "random", "--no-explore", *args)  # fmt: skip
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert words in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").rglob("timings.json"))


def test_new_tokens_on_a_model_that_does_not_generate_is_refused(
    local_board: Board, tmp_path: Path, generation_artifacts: Path
) -> None:
    lowered = subprocess.run(
        [sys.executable, "-m", "fabric", "lower", "--model", "gpt2-tiny", "--backend", "xnnpack",
         "--weights", "random"],
        cwd=PROJECT_ROOT, env={**os.environ, "ETLAB_ARTIFACTS": str(generation_artifacts)}, capture_output=True,
        text=True, timeout=900,
    )  # fmt: skip
    assert lowered.returncode == 0, lowered.stderr
    proc = fab(tmp_path, local_board, generation_artifacts, "run", "--model", "gpt2-tiny", "--backend", "xnnpack",
               "--new-tokens", "4")  # fmt: skip
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert "gpt2-tiny is not a text-generation program" in proc.stdout + proc.stderr


def test_context_scaling_profiles_one_program_per_cache_size_in_one_table_and_plot(
    local_board: Board, tmp_path: Path, generation_artifacts: Path
) -> None:
    # 64 is the model's own context: its program keeps the model's name (and is the one the other tests lowered).
    proc = fab(tmp_path, local_board, generation_artifacts, "deploy-and-profile", "--model", "smollm2-gen-tiny",
               "--backend", "xnnpack", "--weights", "random", "--iterations", "2", "--warmup", "1", "--no-explore",
               "--context", "32,64")  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    assert "Against the context" in said
    summaries = {}
    for program in ("smollm2-gen-tiny.ctx32", "smollm2-gen-tiny"):
        (run,) = [m.parent for m in (tmp_path / "results").glob(f"local/{program}/xnnpack/*/result_manifest.json")]
        summaries[program] = json.loads((run / "analysis" / "summary.json").read_text())["generation"]
    small, large = summaries["smollm2-gen-tiny.ctx32"], summaries["smollm2-gen-tiny"]
    assert (small["context"], large["context"]) == (32, 64)
    assert large["kv_cache_bytes"] == 2 * small["kv_cache_bytes"]  # keys and values of every position
    assert small["tokens"]["agreement"] == large["tokens"]["agreement"] == 1.0  # the cache size changes no id
    (plot,) = (tmp_path / "results" / "context-scaling").glob("smollm2-gen-tiny-*.png")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("model", "context", "words"),
    [
        ("smollm2-gen-tiny", "8", "--context 8: smollm2-gen-tiny's prompt of 8 tokens and 8 new ones need 16"),
        ("smollm2-gen-tiny", "16,x", "--context must be a whole number"),
        ("gpt2-tiny", "64", "--context: gpt2-tiny is not a text-generation model"),
    ],
)
def test_a_bad_context_is_refused_before_anything_is_lowered(
    local_board: Board, tmp_path: Path, model: str, context: str, words: str
) -> None:
    artifacts = tmp_path / "artifacts"
    proc = fab(tmp_path, local_board, artifacts, "deploy-and-profile", "--model", model, "--no-explore",
               "--context", context)  # fmt: skip
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert words in proc.stdout + proc.stderr
    assert not artifacts.exists() or not list(artifacts.rglob("*.pte"))


def test_a_text_prompt_goes_through_the_cached_tokenizer_and_the_text_is_shown(
    local_board: Board, tmp_path: Path
) -> None:
    from tests.lowering.test_generation import LLAMA_TINY, _word_tokenizer

    words = [f"w{i}" for i in range(255)]
    folder = _word_tokenizer(tmp_path / "tokenizer", words)
    spec = {"name": "chat", "model_type": "llama", "task": "text-generation", "model_id": str(folder),
            "config": LLAMA_TINY, "prompt": "w1 w2 w3", "new_tokens": 4, "context": 16}  # fmt: skip
    (tmp_path / "chat.json").write_text(json.dumps(spec))
    proc = fab(tmp_path, local_board, tmp_path / "artifacts", "deploy-and-profile", "--spec",
               str(tmp_path / "chat.json"), "--backend", "xnnpack", "--weights", "random", "--iterations", "1",
               "--warmup", "0", "--no-explore")  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    (run,) = [m.parent for m in (tmp_path / "results").glob("local/chat/xnnpack/*/result_manifest.json")]
    generation = json.loads((run / "analysis" / "summary.json").read_text())["generation"]
    assert generation["prompt_len"] == 3 and "tokenized" in generation["prompt_source"]
    (ids,) = read_tensors(run / "outputs.etlt")
    expected = " ".join("[UNK]" if i == 0 else words[i - 1] for i in ids.array.reshape(-1).tolist())
    assert generation["text"] == {"prompt": "w1 w2 w3", "generated": expected}
    assert f"'w1 w2 w3' → '{expected}'" in " ".join(said.split())


def test_where_accuracy_goes_in_a_language_model_s_prefill(
    local_board: Board, tmp_path: Path, generation_artifacts: Path
) -> None:
    """`--numerics` on an 8da4w language model (4-bit linears, an 8-bit embedding table, fused into ExecuTorch's
    quantized embedding as the timed program is): the timing pass is the generate loop, the numerics pass one prefill
    call of the tapped program on its own inputs (the prompt's ids and their positions, from an empty cache). Every
    operator is measured, the attention over the KV cache included, which reads what the cache writes put there; the
    rotary embedding stays at fp32's rounding, and the embedding and the 4-bit linears lose what they add."""
    model, variant = "smollm2-gen-tiny", "xnnpack-8da4w"
    proc = fab(tmp_path, local_board, generation_artifacts, "deploy-and-profile", "--model", model, "--quantize",
               "8da4w", "--weights", "random", "--iterations", "2", "--warmup", "0", "--no-explore",
               "--numerics")  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    (run,) = [m.parent for m in (tmp_path / "results").glob(f"local/{model}/{variant}/*/result_manifest.json")]
    record = json.loads((generation_artifacts / model / f"{model}_{variant}.numerics.json").read_text())
    run_record = json.loads((run / "run.json").read_text())
    numerics_pass = run_record["numerics_pass"]
    assert numerics_pass["status"] == "ok", numerics_pass
    argv = numerics_pass["argv"]
    assert "--generate" in run_record["runner_argv"] and "--generate" not in argv and "--new-tokens" not in argv
    own_inputs = Path(argv[argv.index("--inputs") + 1])
    assert own_inputs == Path(run_record["parameters"]["numerics_inputs"]) != Path(run_record["inputs"])
    ids, positions = read_tensors(generation_artifacts / model / record["inputs"])
    rows = ids.array.shape[1]
    assert positions.array.tolist() == list(range(rows)) and rows == 8  # the whole prompt in one call

    numerics = json.loads((run / "analysis" / "numerics.json").read_text())
    operators = numerics["operators"]
    assert len(operators) == len(record["taps"]) and json.loads((run / "analysis" / "summary.json").read_text())[
        "numerics"]["status"] == "ok"  # fmt: skip
    assert not any("update_cache" in row["op"] for row in operators)  # a cache write is no value of the model
    by_node = {row["node"]: row for row in operators}
    attends = [row for row in operators if row["op"] == "etlab.attend"]
    assert len(attends) == 2 and all(len(row["reads"]) == 3 for row in attends)  # query, and the caches' k, v
    assert all(row["shape"][2] == rows for row in attends)  # [batch, heads, prompt rows, head dim]
    rotary = [row for row in operators if row["module"] == "model.rotary_emb"]
    assert rotary and all(row["sqnr_db"] > 100 for row in rotary)  # positions only: nothing quantized
    embedding = by_node["embedding"]  # the 8-bit table: its own loss, all of it
    assert 25 < embedding["sqnr_db"] < 100 and embedding["introduced_share"] > 0.9, embedding
    projections = [row for row in operators if row["op"] == "aten.linear" and row["module"].endswith("q_proj")]
    assert len(projections) == 2 and all(row["sqnr_db"] < 35 for row in projections), projections
    assert by_node["linear"]["introduced_share"] > 0.9  # the first 4-bit linear's loss is its own
    assert numerics["output_sqnr_db"][0] < 35
    said = " ".join(said.split())
    assert f"accuracy of {model}/{variant} on local: outputs {numerics['output_sqnr_db'][0]:.1f} dB" in said
    assert f"all {len(operators)} operators: fab analyze --run {run.name}" in said
