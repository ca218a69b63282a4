"""The native runner's generate mode on a real tiny Llama (static KV cache inside the program, dynamic sequence
length), portable and XNNPACK: greedy tokens equal Hugging Face's eager greedy generation; timings.json, the ETDump
and the counters side file have one entry per execute(); the inputs it refuses; and the agent's pass-through."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from tests.board.agent_helpers import sha256
from tests.board.generate_programs import (
    MAX_PROMPT_LEN,
    VOCAB_SIZE,
    GenerateModels,
    generated_prompt,
    make_generate_models,
)
from tests.board.test_runner import error_line, profile_names, run_runner
from tests.plugins.agent import AgentCli
from tests.plugins.runner import RunnerModels

pytestmark = pytest.mark.slow

# A prompt unlike the generated one, from the top of the vocabulary.
FILE_PROMPT = np.array([250, 17, 199, 3, 128, 64, 255, 101], dtype=np.int64)


@pytest.fixture(scope="session")
def generate_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GenerateModels]:
    """The tiny Llama exported once and lowered twice (about 25 s)."""
    yield make_generate_models(tmp_path_factory.mktemp("generate-programs"))


def prompt_file(folder: Path, ids: np.ndarray, name: str = "prompt") -> Path:
    path = folder / f"{name}.etlt"
    write_tensors(path, [NamedTensor(name, ids)])
    return path


def steps(new_tokens: int) -> list[str]:
    return ["prefill"] + ["decode"] * (new_tokens - 1)


def check_generation(
    timings: dict, prompt_len: int, new_tokens: int, runs: tuple[int, int], expected: list[int]
) -> None:
    """timings.json's generation block against the contract (docs/DESIGN.md, "Native runner")."""
    warmup, iterations = runs
    generation = timings["generation"]
    assert generation["prompt_len"] == prompt_len and generation["new_tokens"] == new_tokens
    assert generation["max_prompt_len"] == MAX_PROMPT_LEN
    assert generation["executions"] == steps(new_tokens) * (warmup + iterations)
    assert [run["warmup"] for run in generation["runs"]] == [True] * warmup + [False] * iterations
    for run in generation["runs"]:
        assert run["token_ids"] == expected
        assert len(run["decode_ms"]) == new_tokens - 1
        assert run["prefill_ms"] > 0 and all(ms > 0 for ms in run["decode_ms"])
    # A run's time is its executes' sum (each rounded to 6 decimals in the file).
    totals = [run["prefill_ms"] + sum(run["decode_ms"]) for run in generation["runs"]]
    assert timings["warmup_ms"] + timings["iterations_ms"] == pytest.approx(totals, abs=1e-4)
    phases = [phase["phase"] for phase in timings["memory"]["phases"]]
    assert phases == ["start", "load", "method_init", "first_execution", "decode", "end"]


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
@pytest.mark.parametrize("source", ["file", "generated"])
def test_generated_tokens_equal_eager_greedy(
    runner_binary: Path, generate_models: GenerateModels, backend: str, source: str, tmp_path: Path
) -> None:
    outputs, timings_path, etdump = tmp_path / "outputs.etlt", tmp_path / "timings.json", tmp_path / "etdump.etdp"
    if source == "file":
        prompt, new_tokens = FILE_PROMPT, 5
        prompt_args: list[str | Path] = ["--inputs", prompt_file(tmp_path, prompt.reshape(1, -1)), "--new-tokens", "5"]
    else:  # the defaults: 16 generated ids, 16 new tokens
        prompt, new_tokens = generated_prompt(16), 16
        prompt_args = []
    completed = run_runner(
        runner_binary,
        "--model", generate_models.pte(backend), "--generate", *prompt_args,
        "--warmup", "1", "--iterations", "2", "--threads", "1",
        "--outputs", outputs, "--timings", timings_path, "--etdump", etdump,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr

    expected = generate_models.greedy(prompt, new_tokens)
    assert len(set(expected)) > 1  # a model that repeats one token would hide an off-by-one position
    [tokens] = read_tensors(outputs)
    assert tokens.name == "output_0" and tokens.array.dtype == np.int64 and tokens.array.shape == (1, new_tokens)
    assert tokens.array[0].tolist() == expected
    timings = json.loads(timings_path.read_text())
    assert timings["inputs_source"] == source and timings["generation"]["context"] is None
    check_generation(timings, len(prompt), new_tokens, (1, 2), expected)
    # One "Execute" block per execute(): what lets the workstation split prefill from decode.
    blocks, _ = profile_names(etdump)
    assert blocks == ["Default"] + ["Execute"] * (3 * new_tokens)


def test_a_flat_prompt_at_the_upper_bound_fills_the_context(
    runner_binary: Path, generate_models: GenerateModels, tmp_path: Path
) -> None:
    prompt = (np.arange(MAX_PROMPT_LEN, dtype=np.int64) * 13 + 5) % VOCAB_SIZE
    outputs, timings_path = tmp_path / "outputs.etlt", tmp_path / "timings.json"
    completed = run_runner(
        runner_binary,
        "--model", generate_models.pte("xnnpack"), "--generate", "--inputs", prompt_file(tmp_path, prompt),
        "--prompt-len", str(MAX_PROMPT_LEN), "--new-tokens", "1", "--context", str(MAX_PROMPT_LEN + 1),
        "--warmup", "0", "--iterations", "1", "--outputs", outputs, "--timings", timings_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    expected = generate_models.greedy(prompt, 1)
    assert read_tensors(outputs)[0].array.tolist() == [expected]
    timings = json.loads(timings_path.read_text())
    assert timings["generation"]["context"] == MAX_PROMPT_LEN + 1
    check_generation(timings, MAX_PROMPT_LEN, 1, (0, 1), expected)


def test_non_generate_timings_say_generation_null(
    runner_binary: Path, generate_models: GenerateModels, tmp_path: Path
) -> None:
    # Without --generate the program runs once at its upper-bound shape, as any program does.
    timings_path = tmp_path / "timings.json"
    completed = run_runner(
        runner_binary, "--model", generate_models.pte("portable"), "--iterations", "1", "--timings", timings_path
    )
    assert completed.returncode == 0, completed.stderr
    timings = json.loads(timings_path.read_text())
    assert timings["generation"] is None
    assert "decode" not in [phase["phase"] for phase in timings["memory"]["phases"]]


def test_the_budget_is_checked_between_generations(
    runner_binary: Path, generate_models: GenerateModels, tmp_path: Path
) -> None:
    # A budget spent at once: one warmup and one timed generation still happen, each one whole.
    timings_path = tmp_path / "timings.json"
    completed = run_runner(
        runner_binary, "--model", generate_models.pte("portable"), "--generate", "--prompt-len", "5",
        "--new-tokens", "4", "--warmup", "3", "--iterations", "5", "--max-seconds", "0.000001",
        "--timings", timings_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    timings = json.loads(timings_path.read_text())
    assert timings["stopped_early"] is True
    check_generation(timings, 5, 4, (1, 1), generate_models.greedy(generated_prompt(5), 4))


USAGE_ERRORS = {
    "prompt and tokens beyond the context": (
        ["--generate", "--prompt-len", "60", "--new-tokens", "10", "--context", "64"],
        "prompt length 60 + new tokens 10 exceeds --context 64",
    ),
    "prompt length without generate": (["--prompt-len", "8"], "--prompt-len needs --generate"),
    "new tokens without generate": (["--new-tokens", "8"], "--new-tokens needs --generate"),
    "context below 2": (["--generate", "--context", "1"], "--context needs an integer >= 2, got '1'"),
    "zero new tokens": (["--generate", "--new-tokens", "0"], "--new-tokens needs an integer >= 1, got '0'"),
    "generate with a value": (["--generate=yes"], "--generate takes no value"),
    "zero prefill chunk": (["--generate", "--prefill-chunk", "0"], "--prefill-chunk needs an integer >= 1, got '0'"),
    "prefill chunk without generate": (["--prefill-chunk", "4"], "--prefill-chunk needs --generate"),
}


@pytest.mark.parametrize("case", USAGE_ERRORS)
def test_usage_errors_exit_2_before_loading(runner_binary: Path, tmp_path: Path, case: str) -> None:
    args, message = USAGE_ERRORS[case]
    # The model does not exist: a usage error is found before anything is loaded (else this would be exit 3).
    completed = run_runner(runner_binary, "--model", tmp_path / "missing.pte", *args)
    assert completed.returncode == 2, completed.stderr
    assert message in error_line(completed)


def test_a_prompt_file_beyond_the_context_is_refused_before_loading(runner_binary: Path, tmp_path: Path) -> None:
    completed = run_runner(
        runner_binary, "--model", tmp_path / "missing.pte", "--generate", "--context", "10",
        "--inputs", prompt_file(tmp_path, FILE_PROMPT), "--new-tokens", "3",
    )  # fmt: skip
    assert completed.returncode == 2
    assert "prompt length 8 + new tokens 3 exceeds --context 10" in error_line(completed)


PROMPT_ERRORS: dict[str, tuple[np.ndarray, list[str], str]] = {  # the prompt, more options, the error
    "float prompt": (
        np.zeros((1, 8), dtype=np.float32),
        [],
        "must be int64 [1, P] or [P] with P >= 1, got float32 [1, 8]",
    ),
    "batch of two": (np.zeros((2, 4), dtype=np.int64), [], "got int64 [2, 4]"),
    "empty prompt": (np.zeros((1, 0), dtype=np.int64), [], "got int64 [1, 0]"),
    "length disagrees": (FILE_PROMPT, ["--prompt-len", "5"], "--prompt-len 5 but the prompt in"),
    "id outside the vocabulary": (
        np.array([1, 2, VOCAB_SIZE], dtype=np.int64),
        [],
        f"prompt id {VOCAB_SIZE} at position 2 is outside the vocabulary 0..{VOCAB_SIZE - 1}",
    ),
    "negative id": (np.array([-1], dtype=np.int64), [], "prompt id -1 at position 0"),
}


@pytest.mark.parametrize("case", PROMPT_ERRORS)
def test_bad_prompt_files_exit_6(
    runner_binary: Path, generate_models: GenerateModels, tmp_path: Path, case: str
) -> None:
    ids, args, message = PROMPT_ERRORS[case]
    completed = run_runner(
        runner_binary, "--model", generate_models.pte("xnnpack"), "--generate",
        "--inputs", prompt_file(tmp_path, ids), *args,
    )  # fmt: skip
    assert completed.returncode == 6, completed.stderr
    assert message in error_line(completed)


def test_two_tensors_in_the_prompt_file_exit_6(
    runner_binary: Path, generate_models: GenerateModels, tmp_path: Path
) -> None:
    path = tmp_path / "two.etlt"
    write_tensors(path, [NamedTensor("input_ids", FILE_PROMPT), NamedTensor("cache_position", np.arange(8))])
    completed = run_runner(runner_binary, "--model", generate_models.pte("portable"), "--generate", "--inputs", path)
    assert completed.returncode == 6
    assert "must hold one int64 tensor, it holds 2" in error_line(completed)


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_a_prompt_in_chunks_generates_what_one_prefill_does(
    runner_binary: Path, generate_models: GenerateModels, tmp_path: Path, backend: str
) -> None:
    """`--prefill-chunk 7`: a 20-id prompt prefilled as 7 + 7 + 6 ids at their positions, each an execute (and an
    ETDump block) of the prefill; the ids are eager greedy generation's from the whole prompt."""
    outputs, timings_path, etdump = tmp_path / "outputs.etlt", tmp_path / "timings.json", tmp_path / "etdump.etdp"
    completed = run_runner(
        runner_binary, "--model", generate_models.pte(backend), "--generate", "--prompt-len", "20",
        "--new-tokens", "4", "--prefill-chunk", "7", "--warmup", "0", "--iterations", "1",
        "--outputs", outputs, "--timings", timings_path, "--etdump", etdump,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    expected = generate_models.greedy(generated_prompt(20), 4)
    assert read_tensors(outputs)[0].array[0].tolist() == expected
    generation = json.loads(timings_path.read_text())["generation"]
    (run,) = generation["runs"]
    assert len(run["prefill_chunk_ms"]) == 3 and run["prefill_ms"] == pytest.approx(sum(run["prefill_chunk_ms"]))
    assert generation["executions"] == ["prefill"] * 3 + ["decode"] * 3
    blocks, _ = profile_names(etdump)
    assert blocks == ["Default"] + ["Execute"] * 6


def test_decoding_past_the_cache_exits_7_naming_the_position(
    runner_binary: Path, generate_models: GenerateModels
) -> None:
    # Without --context the runner cannot know the cache's size: the program's own bounds check stops it.
    completed = run_runner(
        runner_binary, "--model", generate_models.pte("xnnpack"), "--generate", "--prompt-len", "60",
        "--new-tokens", "10", "--warmup", "0", "--iterations", "1",
    )  # fmt: skip
    assert completed.returncode == 7, completed.stderr
    assert "execution failed in decode step 5 (position 64) of timed run 1 of 1" in error_line(completed)


def test_a_program_that_is_not_a_language_model_exits_6(runner_binary: Path, runner_models: RunnerModels) -> None:
    # DistilBERT: input_ids and attention_mask, both int64 [1, 128], but attention_mask is not a cache position.
    completed = run_runner(runner_binary, "--model", runner_models.pte("xnnpack"), "--generate")
    assert completed.returncode == 6, completed.stderr
    line = error_line(completed)
    assert "input 1 (cache_position) must be an int64 tensor of rank 1" in line and "not a text-generation" in line


def test_counters_count_every_execute(runner_binary: Path, generate_models: GenerateModels, tmp_path: Path) -> None:
    probe = json.loads(run_runner(runner_binary, "--probe-counters").stdout)
    if probe["counters"].get("task_clock") != "ok":
        pytest.skip(f"task_clock does not open here: {probe}")
    etdump, counters_out = tmp_path / "etdump.etdp", tmp_path / "counters.json"
    completed = run_runner(
        runner_binary, "--model", generate_models.pte("xnnpack"), "--generate", "--prompt-len", "4",
        "--new-tokens", "3", "--warmup", "1", "--iterations", "1", "--threads", "1",
        "--etdump", etdump, "--counters", "task_clock", "--counters-out", counters_out,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    counters = json.loads(counters_out.read_text())
    assert counters["captured"] == ["task_clock"]
    assert len(counters["executions"]) == 2 * 3  # (warmup + timed) x (prefill + 2 decode steps)
    assert all(rows and all(row[3] > 0 for row in rows) for rows in counters["executions"])
    blocks, _ = profile_names(etdump)
    assert blocks == ["Default"] + ["Execute"] * 6


def test_the_agent_passes_generate_through(
    provisioned_agent: AgentCli, generate_models: GenerateModels, tmp_path: Path
) -> None:
    agent = provisioned_agent
    model_sha = sha256(generate_models.xnnpack_pte)
    model = agent.workdir / "models" / f"{model_sha}.pte"
    model.parent.mkdir(parents=True)
    shutil.copyfile(generate_models.xnnpack_pte, model)
    Path(f"{model}.sha256").write_text(f"{model_sha}  {model.name}\n")

    result = agent.run(
        "profile", "--model", model, "--run-id", "gen-1", "--generate", "--prompt-len", "6",
        "--new-tokens", "4", "--context", "64", "--warmup", "1", "--iterations", "2", "--threads", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    bundle = agent.bundle("gen-1")
    run = json.loads((bundle / "run.json").read_text())
    argv = run["runner_argv"]
    assert "--generate" in argv
    for flag, value in (("--prompt-len", "6"), ("--new-tokens", "4"), ("--context", "64")):
        assert argv[argv.index(flag) + 1] == value
    parameters = run["parameters"]
    assert (parameters["generate"], parameters["prompt_len"], parameters["new_tokens"], parameters["context"]) == (
        True, 6, 4, 64,
    )  # fmt: skip
    expected = generate_models.greedy(generated_prompt(6), 4)
    [tokens] = read_tensors(bundle / "outputs.etlt")
    assert tokens.array.shape == (1, 4) and tokens.array[0].tolist() == expected
    timings = json.loads((bundle / "timings.json").read_text())
    check_generation(timings, 6, 4, (1, 2), expected)
    assert timings["generation"]["context"] == 64


def test_the_agent_refuses_generate_options_without_generate(provisioned_agent: AgentCli, tmp_path: Path) -> None:
    model = tmp_path / "model.pte"
    model.write_bytes(b"not run")
    result = provisioned_agent.run("profile", "--model", model, "--run-id", "gen-2", "--new-tokens", "4")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--new-tokens needs --generate" in result.document["error"]
    bounded = provisioned_agent.run("profile", "--model", model, "--run-id", "gen-3", "--generate", "--context", "1")
    assert bounded.returncode == 2


def test_the_agent_refuses_a_generate_numerics_pass_without_its_own_inputs(
    provisioned_agent: AgentCli, tmp_path: Path
) -> None:
    """A generate run's numerics pass is one prefill call: without the program's own inputs (ids and positions) it
    would run the numerics program on the prompt alone; refused (2) before anything runs, as are inputs alone."""
    files = {name: tmp_path / name for name in ("model.pte", "numerics.pte", "reference.etlt", "inputs.etlt")}
    for path in files.values():
        path.write_bytes(b"not run")
    numerics: list[str | Path] = [
        "--numerics-model",
        files["numerics.pte"],
        "--numerics-reference",
        files["reference.etlt"],
    ]
    base: list[str | Path] = ["profile", "--model", files["model.pte"], "--generate", "--context", "64"]
    result = provisioned_agent.run(*base, "--run-id", "gen-4", *numerics)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "needs --numerics-inputs" in result.document["error"]
    alone = provisioned_agent.run(*base, "--run-id", "gen-5", "--numerics-inputs", files["inputs.etlt"])
    assert alone.returncode == 2 and "--numerics-inputs needs --numerics-model" in alone.document["error"]
