"""`fab nightly`, and the lab that can share its night: `fab lab`, `fab worker`, `fab lab-scheduler`, `fab lab-certs`
(lab/cluster.py)."""

from __future__ import annotations

import socket
import unicodedata
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.boards.inventory import Inventory, load_inventory
from orchestrator.commands import options
from orchestrator.commands.common import split_list
from orchestrator.config import Invalid
from orchestrator.errors import ExitCode, UsageError
from orchestrator.lab import cluster  # Dask itself is imported only when a lab is reached
from orchestrator.lab.lab_settings import LabSettings, check_address, load_lab_settings


def _settings(inventory: str | None, scheduler: str | None) -> tuple[Inventory, LabSettings]:
    address = None
    if scheduler is not None:
        try:
            address = check_address(str(scheduler))
        except Invalid as exc:
            raise UsageError(f"--scheduler: {exc}") from None
    loaded = load_inventory(Path(inventory) if inventory else None)
    settings = load_lab_settings(loaded, scheduler=address)
    if settings is None:
        raise UsageError(
            f"{loaded.path}: no `lab:` section: a lab needs its scheduler, certificates and store",
            hint="see README.md (A lab of several hosts)",
        )
    return loaded, settings


def worker_task(*, inventory: str | None, scheduler: str | None, name: str | None, boards: str | None,
                no_lowering: bool) -> int:  # fmt: skip
    loaded, settings = _settings(inventory, scheduler)
    worker_name = name or socket.gethostname()
    if (
        not worker_name
        or len(worker_name) > 128
        or any(c in worker_name for c in "/ ")
        or any(unicodedata.category(c).startswith("C") for c in worker_name)
    ):
        raise UsageError(
            f"--name: {worker_name!r} is not a worker name (1-128 characters, no '/', space or control character)"
        )
    chosen = [] if boards == "none" else split_list(boards)  # `--boards none`: a host that only lowers
    offer = cluster.offer(loaded, worker_name, boards=chosen, lowering=not no_lowering)
    for board in offer.unreachable:
        console.warn(f"board {board} does not answer from here: not offered to the lab")
    lowering = f"lowering with {offer.memory_gb:g} GB free, {offer.cores} cores" if offer.lowering else "no lowering"
    console.info(f"worker {worker_name}: boards {', '.join(offer.boards) or 'none'}; {lowering}")
    try:
        return cluster.run_worker(settings, loaded, offer)
    except cluster.WorkerNameTaken as exc:
        exc.hint = "give this host another --name"
        raise


def scheduler_task(*, inventory: str | None, scheduler: str | None) -> int:
    _, settings = _settings(inventory, scheduler)
    return cluster.run_scheduler(settings)


def certs_task(*, folder: str) -> int:
    target = Path(folder).expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UsageError(f"{target} is not an empty folder: the lab's certificates go into a folder of their own")
    try:
        written = cluster.make_certificates(target)
    except OSError as exc:
        raise UsageError(f"cannot write the lab's certificates into {target}: {exc.strerror or exc}") from None
    console.info(f"the lab's certificates: {', '.join(str(path) for path in written)}")
    console.info("copy the folder to every host of the lab (keep lab-key.pem private); in the inventory: "
                 f"`lab: {{certificates: {target}}}`")  # fmt: skip
    return ExitCode.OK


def lab_task(*, inventory: str | None, scheduler: str | None) -> int:
    _, settings = _settings(inventory, scheduler)
    state = cluster.lab_state(settings)
    rows = []
    for worker in state.workers:
        memory = f"{worker.memory_gb:g} GB free" if worker.memory_gb is not None else "no lowering"
        memory += f", {worker.cores} cores" if worker.cores else ""
        etlab = "yes" if worker.same_etlab else "another etlab: takes none of this workstation's work"
        rows.append([worker.name, worker.address, ", ".join(worker.boards) or "none", memory, etlab,
                     "\n".join(worker.running) or "idle"])  # fmt: skip
    queue = f"queue: {len(state.waiting)} task(s) no worker can take now" if state.waiting else "queue: empty"
    console.table(
        f"lab {state.scheduler}: {len(state.workers)} worker(s)",
        ["worker", "address", "boards", "lowers", "same etlab", "running now"],
        rows,
        caption=queue,
    )
    if state.waiting:
        console.table(None, ["waiting task", "needs a worker with"], [list(pair) for pair in state.waiting])
    return ExitCode.OK


def nightly_task(
    *, inventory: str | None, night: Any, history: Any, reports: str | None, wait: bool, record_pending: bool
) -> int:
    """`fab nightly`: `--night` and `--history` checked (exit 64), then the night."""
    date = None if night is None else options.night(night)
    url = None if history is None else options.history(history)
    return nightly_job(inventory, date, url, reports, wait=wait, record_pending=record_pending)


def nightly_job(
    inventory: str | None,
    night: str | None,
    history: str | None,
    reports: str | None,
    *,
    wait: bool = False,
    record_pending: bool = False,
) -> int:
    # here, not at the top: the nightly's modules (SQLAlchemy, the history, the reports) are its alone
    from orchestrator.commands.render_night import print_night
    from orchestrator.lab.nightlock import NightBusy
    from orchestrator.lab.nightly import record_pending_results, run_nightly
    from orchestrator.lab.reports_folder import ReportsFolderTaken

    if record_pending:
        return record_pending_results(
            load_inventory(Path(inventory) if inventory else None),
            history_url=history,
            reports_dir=Path(reports) if reports else None,
        )
    loaded = load_inventory(Path(inventory) if inventory else None)
    try:
        report = run_nightly(
            loaded,
            night=night,
            history_url=history,
            reports_dir=Path(reports) if reports else None,
            wait=wait,
            lab=load_lab_settings(loaded),
        )
    except NightBusy as exc:
        exc.hint = "`fab nightly --wait` waits for it, then runs only the cells it did not"
        raise
    except ReportsFolderTaken as exc:
        exc.hint = (
            "give each history its own reports folder: `reports:` in the inventory's nightly section, or --reports "
            f"DIR (if the history itself moved, remove {exc.marker} and this one takes the folder over)"
        )
        raise
    print_night(report)
    if "html" in report.outputs:  # the static dashboard next to the night's reports
        # here, not at the top: the dashboard's modules load Jinja2, which only this and `fab dashboard` need
        from orchestrator.commands.dashboard import nightly_dashboard, sources

        folder = report.outputs["html"].parent / f"dashboard-{report.night}"
        if nightly_dashboard(sources(inventory, history), folder) is not None:
            console.info(console.escape(f"dashboard: {folder / 'index.html'}"))
    return report.exit_code
