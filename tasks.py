"""Fabric tasks. Each one only declares its name, help and options, and calls one function of orchestrator/commands/
that checks them and runs the task (see docs/DESIGN.md)."""

from __future__ import annotations

from orchestrator.commands import options
from orchestrator.commands.handling import handle_errors
from orchestrator.lowering.quantize.schemes import QUANTIZED
from orchestrator.lowering.rewrites.registry import REWRITES

task = options.task  # fabric's task, short flags letters only: `--new-tokens -1` reaches its check

SELECT_HELP = {
    "board": "comma-separated board names (default: the inventory's `default` group, else `local`)",
    "group": "a group from the inventory",
    "tag": "only boards with this tag",
    "inventory": "inventory file (default: inventory.yaml)",
    "lg_wait": "labgrid places: seconds to wait for a place held by someone else (default: as long as it takes)",
}
MODEL_HELP = {
    "model": "a built-in model (`fab models` lists them: distilbert, gpt2, mobilenet-v2, ...), or one lowered from "
    "--spec or your own file",
    "spec": "path to your own model_spec.json (instead of --model)",
}
PTE_HELP = {
    "pte": "profile a .pte you lowered yourself (instead of --model/--spec); inputs made from its declared shapes",
    "reference": "with --pte: its expected outputs (ETLT file) to check correctness against; else not checked",
    "name": "with --pte: the folder under artifacts/ (default: the file's stem)",
}
QUANTIZE_HELP = (
    f"comma-separated: none (fp32, default), {', '.join(scheme.name for scheme in QUANTIZED)}; each adds the "
    "XNNPACK program xnnpack-<scheme>"
)
REWRITES_HELP = (
    f"none (default: the model as exported), auto (those that apply), or comma-separated: {', '.join(REWRITES)}"
)
ACCURACY_HELP = {
    "min_sqnr": "accuracy gate of quantized runs: minimum SQNR vs fp32 eager in dB (default 10)",
    "min_top1": "accuracy gate: minimum share of logits rows whose top-1 agrees with fp32 eager, 0-1 (default 0.9)",
    "min_top5": "accuracy gate: minimum top-5 overlap with fp32 eager, 0-1 (default 0.6)",
}
TRUST_HELP = (
    "run the Python files of the spec's model folder (its config.json auto_map) with your privileges; "
    "only for code you have read. A spec file cannot ask for this"
)
TRUST_CODE_HELP = (
    'run the Python factory a spec names ("factory": "file.py:build") with your privileges; only for code '
    "you have read. A spec file cannot ask for this"
)
ATTENTION_HELP = (
    "text-generation models: how the program attends, etlab (default: etlab's operators, over the filled cache "
    "only) or sdpa (transformers' static cache with standard operators); the other one is its own program"
)
CONTEXT_HELP = (
    "text-generation models: KV cache sizes, one program each (e.g. 128,512,1024: prefill time, decode speed and "
    "memory against the context, in one table and one plot); default: the model's"
)
KEEP_FLOAT_HELP = (
    "with --quantize: layers (module paths, comma-separated) kept in float, a mixed-precision program of its own "
    "(`fab advise` proposes them after a run with --numerics)"
)
MARKDOWN_HELP = (
    "text-generation models: the figures as markdown to paste into an issue too: llama-bench's table (prefill pp and "
    "decode tg tokens/s ± standard deviation, size, params, threads), then TTFT, decode step ms, memory, ids vs eager"
)
EXECUTION_HELP = (
    "the execution analysis/trace.json draws: median (the one nearest the median, the default), first, or N (the "
    "Nth measured iteration; a text generation's decode step N, with its prompt's prefill)"
)
CHOICE_HELP = {  # what makes a model's program another (lowering/program.py)
    "rewrites": REWRITES_HELP,
    "keep_float": KEEP_FLOAT_HELP,
    "context": CONTEXT_HELP,
    "attention": ATTENTION_HELP,
}
RUN_HELP = {
    "iterations": "timed iterations (default 20)",
    "warmup": "untimed warmup runs (default 3)",
    "threads": "runner threads (default: the board's inventory setting, else all cores)",
    "max_seconds": "time budget for the timed loop; stops early once spent (default 120)",
    "counters": "after the timing pass, a single-threaded hardware-counters pass: --counters alone for the default "
    "set, or --counters=cycles,instructions,task_clock,...",
    "new_tokens": "text-generation programs: tokens generated after the prompt (default: the model's, e.g. 32); "
    "the prompt and these must fit the KV cache",
    "numerics": "after the timing pass, a numerics pass: every operator's values against fp32 eager (delegates "
    "included): --numerics alone for statistics per tensor, --numerics=full for the tensors too",
}


@task(
    help={
        **MODEL_HELP,
        "backend": "comma-separated backends: portable,xnnpack (default both)",
        **{"quantize": QUANTIZE_HELP},
        "calibration": "int8-static calibration samples: an ETLT file (input_ids [N, seq]) or JSON token-id lists",
        "jobs": "variants lowered at once, this process included (default: the idle cores, as memory allows)",
        "weights": "auto (default: pretrained, else random with a warning), pretrained, or random",
        "etrecord": "also write an ETRecord (about twice the size of the .pt2)",
        "force": "re-lower even when the cache is valid",
        "trust_remote_code": TRUST_HELP,
        "trust_code": TRUST_CODE_HELP,
        "exported": "lower your own ExportedProgram (a torch.export.save'd .pt2) instead of --model/--spec",
        "name": "with --exported: the folder under artifacts/ (default: the file's stem)",
        **CHOICE_HELP,
    }
)
@handle_errors
def lower(c, model=None, spec=None, backend="portable,xnnpack", weights="auto", etrecord=False, force=False,
          quantize="none", calibration=None, jobs=None, trust_remote_code=False, trust_code=False, exported=None,
          name=None, rewrites="none", context=None, attention=None, keep_float=None):  # fmt: skip
    """Export a model and lower it to portable and/or XNNPACK .pte files (and quantized variants) under artifacts/."""
    given = options.given(locals())
    from orchestrator.commands.lower import lower as lower_model

    return lower_model(given)


@task(help={**SELECT_HELP, "force": "re-provision even if the board is up to date"})
@handle_errors
def setup_board(c, board=None, group=None, tag=None, inventory=None, lg_wait=None, force=False):
    """Provision boards: push the runtime and board/, build the runner on the board, verify it."""
    from orchestrator.commands.board import setup_board_task

    return setup_board_task(board=board, group=group, tag=tag, inventory=inventory, lg_wait=lg_wait, force=force)


@task(help={**SELECT_HELP, **MODEL_HELP, **PTE_HELP, **CHOICE_HELP,
            "backend": "portable, xnnpack or both (default xnnpack)", "quantize": QUANTIZE_HELP})  # fmt: skip
@handle_errors
def push(c, model=None, spec=None, backend="xnnpack", board=None, group=None, tag=None, inventory=None, lg_wait=None,
         quantize="none", pte=None, reference=None, name=None, rewrites="none", context=None,
         attention=None, keep_float=None):  # fmt: skip
    """Push lowered .pte files (content-addressed, verified) and their reference inputs to boards."""
    given = options.given(locals())
    from orchestrator.commands.board import push_task

    return push_task(given)


@task(help={**SELECT_HELP, **MODEL_HELP, **PTE_HELP, **RUN_HELP, **CHOICE_HELP,
            "backend": "portable, xnnpack or both (default xnnpack)",
            "timeout": "hard runner timeout in seconds (default: derived from the budget)",
            "quantize": QUANTIZE_HELP},
      optional=["counters", "numerics"])  # fmt: skip
@handle_errors
def run(c, model=None, spec=None, backend="xnnpack", board=None, group=None, tag=None, inventory=None, lg_wait=None,
        iterations=None, warmup=None, threads=None, max_seconds=None, timeout=None, counters=None, numerics=None,
        quantize="none", pte=None, reference=None, name=None, new_tokens=None, rewrites="none", context=None,
        attention=None, keep_float=None):  # fmt: skip
    """Profile the pushed model on each board through its agent (under the board lock)."""
    given = options.given(locals())
    from orchestrator.commands.board import run_task

    return run_task(given)


@task(help={**SELECT_HELP, "run": "pull this run id (or a unique prefix)", "latest": "only each board's latest run"})
@handle_errors
def pull(c, run=None, latest=False, board=None, group=None, tag=None, inventory=None, lg_wait=None):
    """Pull result bundles (verified against their manifests) into results/<board>/<model>/<backend>/<run-id>/."""
    from orchestrator.commands.board import pull_task

    return pull_task(run, latest=latest, board=board, group=group, tag=tag, inventory=inventory, lg_wait=lg_wait)


@task(help={"run": "run id (or unique prefix) under results/", "latest": "the latest pulled run (default)",
            "bundle": "analyse this bundle folder instead",
            "by": "module: the time by module of the model; module:DEPTH rolled up to DEPTH levels",
            "markdown": MARKDOWN_HELP, "execution": EXECUTION_HELP, **ACCURACY_HELP})  # fmt: skip
@handle_errors
def analyze(c, run=None, latest=False, bundle=None, min_sqnr=None, min_top1=None, min_top5=None, by=None,
            markdown=False, execution=None):  # fmt: skip
    """Per-operator statistics, summary.json, validity and Model Explorer overlays for a pulled run."""
    from orchestrator.commands.results import analyze_task

    return analyze_task(
        run, latest=latest, bundle=bundle, min_sqnr=min_sqnr, min_top1=min_top1, min_top5=min_top5, by=by,
        markdown=markdown, execution=execution,
    )  # fmt: skip


@task(help={"run": "show this run's overlays", "model": "show this model (with its latest run's overlays)",
            "host": "bind address (default 127.0.0.1; anything else exposes local files)",
            "port": "port (default 8081)", "no_browser": "do not open a browser (headless machines)"})  # fmt: skip
@handle_errors
def explore(c, run=None, model=None, host="127.0.0.1", port=None, no_browser=False):
    """Open Model Explorer with the .pt2, both .pte files and the run's cost overlays."""
    from orchestrator.commands.results import explore_task

    return explore_task(run, model=model, host=host, port=port, no_browser=no_browser)


@task(positional=["run_a", "run_b"], help={"run_a": "baseline run id", "run_b": "new run id",
            "interleave": "re-run both programs alternately on --board for N rounds (>= 5) to confirm a change",
            "retest_seconds": "time budget of the --interleave re-test: no new round starts once spent (default 180)",
            "board": "the one board for --interleave", "inventory": "inventory file (default: inventory.yaml)",
            "allow_rebuilt": "compare different builds of the same program (implied by --interleave)",
            "numerics": "compare the runs' numerics passes instead: the first operator where they part ways (two "
                        "boards, two ExecuTorch versions, fp32 against int8), with the error each adds",
            "markdown": MARKDOWN_HELP})  # fmt: skip
@handle_errors
def compare(c, run_a, run_b, interleave=None, retest_seconds=None, board=None, inventory=None, allow_rebuilt=False,
            numerics=False, markdown=False):  # fmt: skip
    """Per-operator and total deltas between two runs, a noise-aware verdict, a diff overlay. Exit 1: a regression."""
    from orchestrator.commands.results import compare_task

    return compare_task(
        run_a, run_b, interleave=interleave, retest_seconds=retest_seconds, board=board, inventory=inventory,
        allow_rebuilt=allow_rebuilt, numerics=numerics, markdown=markdown,
    )  # fmt: skip


@task(help={"run": "advise on this run id (or unique prefix); default: the latest run",
            "model": "the latest run of this model",
            "board": "with --model: the latest run on this board; with --try: the board to measure on (default: "
                     "the run's)",
            "try": "lower the proposed change (rewrites, layers kept in float), check its outputs, measure speed "
                   "with an interleaved A/B and accuracy on the board: the speed/accuracy front",
            "each": "with --try: one A/B per rewrite too", "rounds": "with --try: A/B rounds (>= 5, default 8)",
            "retest_seconds": "with --try: time budget per A/B (default 180)",
            "inventory": "inventory file (default: inventory.yaml)",
            "trust_remote_code": f"with --try: {TRUST_HELP}",
            "trust_code": f"with --try: {TRUST_CODE_HELP}"})  # fmt: skip
@handle_errors
def advise(c, run=None, model=None, board=None, try_=False, each=False, rounds=None, retest_seconds=None,
           inventory=None, trust_remote_code=False, trust_code=False):  # fmt: skip
    """Where the time goes → what to change: findings, predicted savings (from the profile) and fixes."""
    from orchestrator.commands.advise import advise_task

    return advise_task(
        run, model=model, board=board, try_=try_, each=each, rounds=rounds, retest_seconds=retest_seconds,
        inventory=inventory, trust_remote_code=trust_remote_code, trust_code=trust_code,
    )  # fmt: skip


@task(help={"long": "the detailed tables: each built-in's source, output, description and every variant lowered, "
                     "each lowered model's spec file and lowering time"})  # fmt: skip
@handle_errors
def models(c, long=False):
    """The models --model takes, one line each: the built-ins, and those lowered from a spec file or your program."""
    from orchestrator.commands.models import list_models

    return list_models(long=long)


@task(
    help={
        **{key: text for key, text in SELECT_HELP.items() if key != "lg_wait"},
        "health": "run each board's health job now (disk, memory, verification program, throttling, governor)",
    }
)
@handle_errors
def boards(c, board=None, group=None, tag=None, inventory=None, health=False):
    """The inventory as a table: reachable, architecture, board model, runtime, lock holder, temperature, service."""
    from orchestrator.commands.board import boards_task

    return boards_task(board=board, group=group, tag=tag, inventory=inventory, health=health)


@task(help={key: text for key, text in SELECT_HELP.items() if key != "lg_wait"})
@handle_errors
def return_to_service(c, board=None, group=None, tag=None, inventory=None):
    """Bring an out-of-service board back: its health job runs, and a board that passes is back in service."""
    from orchestrator.commands.board import return_to_service

    return return_to_service(board=board, group=group, tag=tag, inventory=inventory)


@task(help={**SELECT_HELP, "keep": "bundles to keep per board (default 20)"})
@handle_errors
def gc(c, keep=None, board=None, group=None, tag=None, inventory=None, lg_wait=None):
    """Free space on boards: old bundles, leftovers, models no kept bundle uses."""
    from orchestrator.commands.board import gc_task

    return gc_task(keep, board=board, group=group, tag=tag, inventory=inventory, lg_wait=lg_wait)


@task(help={**MODEL_HELP, **PTE_HELP, **SELECT_HELP, **RUN_HELP,
            "backend": "xnnpack (default; the portable program is lowered too, for Model Explorer), portable, or "
                       "portable,xnnpack for the comparison: only those are lowered",
            "weights": "auto (default), pretrained or random", "no_explore": "do not launch Model Explorer",
            "no_browser": "launch Model Explorer without opening a browser",
            "port": "Model Explorer port (8081)", "quantize": QUANTIZE_HELP, **ACCURACY_HELP,
            "calibration": "int8-static calibration samples (ETLT input_ids [N, seq], or JSON token-id lists)",
            "jobs": "variants lowered at once, this process included (default: the idle cores, as memory allows)",
            "trust_remote_code": TRUST_HELP, "trust_code": TRUST_CODE_HELP, "markdown": MARKDOWN_HELP, **CHOICE_HELP},
      optional=["counters", "numerics"])  # fmt: skip
@handle_errors
def deploy_and_profile(c, model=None, spec=None, backend=None, board=None, group=None, tag=None, inventory=None,
                       lg_wait=None, iterations=None, warmup=None, threads=None, max_seconds=None, weights="auto",
                       no_explore=False, no_browser=False, port=None, counters=None, quantize="none",
                       calibration=None, min_sqnr=None, min_top1=None, min_top5=None, jobs=None,
                       trust_remote_code=False, trust_code=False, pte=None, reference=None, name=None,
                       rewrites="none", new_tokens=None, context=None, attention=None, numerics=None,
                       keep_float=None, markdown=False):  # fmt: skip
    """Lower → setup-board → push → run → pull → analyze → explore, on every selected board."""
    given = options.given(locals())
    from orchestrator.commands.deploy import deploy_task

    return deploy_task(given)


@task(help={"port": "port on 127.0.0.1 (default 8080)", "no_browser": "do not open a browser (headless machines)",
            "static": "write the pages into this folder instead (self-contained: opens from file://, no network)",
            "inventory": "inventory file: its boards and its nightly history (default: inventory.yaml, if present)",
            "history": "SQLAlchemy URL of the history (default: the inventory's, else .etlab/history.sqlite)"
            })  # fmt: skip
@handle_errors
def dashboard(c, port=None, no_browser=False, static=None, inventory=None, history=None):
    """The lab in a browser: boards, the latest night's verdicts, trends, runs, comparisons (or --static pages)."""
    from orchestrator.commands.dashboard import dashboard_task

    return dashboard_task(port=port, no_browser=no_browser, static=static, inventory=inventory, history=history)


@task(help={"inventory": "inventory file with a `nightly:` section (default: inventory.yaml)",
            "night": "the night's date, YYYY-MM-DD (default: today); re-running a night resumes it",
            "history": "SQLAlchemy URL of the history (default: sqlite:///.etlab/history.sqlite)",
            "reports": "folder for the HTML, markdown and JUnit reports",
            "wait": "when another nightly runs the same night on the same history, wait for it (default: exit 75)",
            "record_pending": "only record the results earlier nightlies measured but could not record"})  # fmt: skip
@handle_errors
def nightly(c, inventory=None, night=None, history=None, reports=None, wait=False, record_pending=False):
    """Run the nightly matrix, record it, flag real regressions and write reports (exit codes below).

    Exit 0 ok, 1 regression, 2 infra, 75 another nightly holds the night."""
    from orchestrator.commands.lab import nightly_task

    return nightly_task(
        inventory=inventory, night=night, history=history, reports=reports, wait=wait, record_pending=record_pending
    )


LAB_HELP = {
    "inventory": "inventory file with a `lab:` section (default: inventory.yaml)",
    "scheduler": "the lab's scheduler address, tls://HOST:PORT (default: the inventory's lab.scheduler)",
}


@task(help={**LAB_HELP, "name": "this worker's name in the lab and in the history (default: the host's name)",
            "boards": "comma-separated boards to offer (default: every board of the inventory that answers)",
            "no_lowering": "take no lowering work (a small host that only reaches boards)"})  # fmt: skip
@handle_errors
def worker(c, inventory=None, scheduler=None, name=None, boards=None, no_lowering=False):
    """Join the lab: run its nights' lowerings and the cells of the boards this host reaches, until stopped."""
    from orchestrator.commands.lab import worker_task

    return worker_task(inventory=inventory, scheduler=scheduler, name=name, boards=boards, no_lowering=no_lowering)


@task(name="lab-scheduler", help=LAB_HELP)
@handle_errors
def lab_scheduler(c, inventory=None, scheduler=None):
    """Run the lab's scheduler (mutual TLS with the lab's certificates), until stopped."""
    from orchestrator.commands.lab import scheduler_task

    return scheduler_task(inventory=inventory, scheduler=scheduler)


@task(name="lab-certs", help={"folder": "an empty folder for the lab's CA, certificate and key"})
@handle_errors
def lab_certs(c, folder):
    """Make the lab's certificates: copy the folder to every host of the lab."""
    from orchestrator.commands.lab import certs_task

    return certs_task(folder=folder)


@task(help=LAB_HELP)
@handle_errors
def lab(c, inventory=None, scheduler=None):
    """The lab's workers, what each runs now, and the queue."""
    from orchestrator.commands.lab import lab_task

    return lab_task(inventory=inventory, scheduler=scheduler)
