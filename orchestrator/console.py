"""Everything users see in the terminal: stage timings, progress bars, tables, warnings.

Library modules report through these helpers and never print directly, so the look of etlab
lives in one place (the httpie way).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import warnings as warnings_module
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, OverflowMethod, RenderableType
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

# Progress and chatter go to stderr, tables and results to stdout, so output can be piped.
out = Console(highlight=False, soft_wrap=False)
if not out.is_terminal:
    # Piped output and CI logs: wide enough that tables do not wrap every cell.
    out.width = int(os.environ.get("ETLAB_WIDTH", "140"))
err = Console(stderr=True, highlight=False, soft_wrap=True)
_lock = threading.Lock()

# `-v`/`--verbose` (every task, parsed once by commands/options.py's Task): every step's start and end line. Without
# it a step is silent unless it runs longer than LONG_STEP_S: then its start is said when that time has passed, and
# its end with its time, so a long step still shows that it goes on and what it cost.
_verbose = False
LONG_STEP_S = 3.0
# The warnings said so far in this task (None: outside a task, every warning is said): each is said once.
_warned: set[str] | None = None


def set_verbose(on: bool) -> None:
    global _verbose
    _verbose = bool(on)


def verbose() -> bool:
    return _verbose


@contextlib.contextmanager
def warnings_once() -> Iterator[None]:
    """Within it (a task: commands/handling.py's handle_errors), a warning already said is not said again."""
    global _warned
    outer, _warned = _warned, set()
    try:
        yield
    finally:
        _warned = outer


def _first_time(message: str) -> bool:
    with _lock:
        if _warned is None:
            return True
        if message in _warned:
            return False
        _warned.add(message)
        return True


# Terminal control characters (ESC starts ANSI sequences; C1 has a one-byte CSI) and the bidi overrides that
# reorder what is shown. Text from a board may carry them; none has a place in etlab's output.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def inert(text: str) -> str:
    """`text` with every control character shown as a visible escape (ESC -> \\x1b), so it cannot steer the
    terminal. Newlines and tabs stay. Rich markup is escaped separately, by escape()."""
    return _CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), text)


def info(message: str) -> None:
    """A progress line; may use rich markup, so callers escape() text that came from outside."""
    with _lock:
        err.print(inert(message))


def plain(message: str, *, stderr: bool = True) -> None:
    """Text printed exactly as given on unbroken lines (URLs, paths to copy and paste)."""
    with _lock:
        (err if stderr else out).print(inert(message), soft_wrap=True, markup=False, highlight=False)


def detail(message: str) -> None:
    """A progress line said only under `-v` (a board already provisioned, a step that went as expected)."""
    if _verbose:
        info(message)


def warn(message: str) -> None:
    """A warning, said once per task (see warnings_once)."""
    if not _first_time(message):
        return
    with _lock:
        err.print(f"[bold yellow]WARNING[/]: {escape(inert(message))}")


def loud_warning(message: str) -> None:
    """A warning users must not miss (e.g. random weights used instead of pretrained)."""
    if not _first_time(message):
        return
    with _lock:
        err.rule("[bold red]WARNING[/]")
        err.print(f"[bold red]{escape(inert(message))}[/]")
        err.rule()


def error(message: str) -> None:
    with _lock:
        err.print(f"[bold red]error[/]: {escape(inert(message))}")


def format_seconds(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


_BYTE_UNITS = ("kB", "MB", "GB", "TB")


def format_bytes(count: int) -> str:
    """An amount of memory in the unit that shows it, with three significant digits: "512 B", "32.8 kB", "14.3 MB"
    (a tiny model's 32 kB KV cache is no "0.0 MB")."""
    if count < 1000:
        return f"{count} B"
    value, unit = float(count), "B"
    for unit in _BYTE_UNITS:
        value /= 1000.0
        if round(value) < 1000 or unit == _BYTE_UNITS[-1]:
            break
    return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"


def format_ms(ms: float) -> str:
    """A time in milliseconds, three significant digits and never an exponent: "0.124 ms", "3.6 ms", "1,180 ms"
    (not "1.18e+03 ms"); below a microsecond, in µs."""
    if ms != 0 and abs(ms) < 0.001:
        return f"{ms * 1000:.3g} µs"
    if abs(ms) >= 1000:
        return f"{ms:,.0f} ms"
    return f"{ms:.3g} ms"


def format_share(share: float) -> str:
    """A share of a run as a whole percent, a small one never "0%": "<1%" (a 3.6 ms finding of a 1 s run)."""
    said = f"{share:.0%}"
    if share != 0 and said in ("0%", "-0%"):
        return "<1%" if share > 0 else ">-1%"
    return said


class StageTimer:
    """Records how long each named stage took, for progress lines and benchmarks.

    Under `-v` every stage says its start and end; otherwise only a stage longer than LONG_STEP_S does (its start
    once that time has passed, then its end and time), and a failed one. `shown=False`: a live display shows the
    stages (deploy's per-cell progress), so only `-v` and failures print."""

    def __init__(self, prefix: str = "", *, shown: bool = True) -> None:
        self.prefix = prefix
        self.shown = shown
        self.durations: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str, *, quiet: bool = False) -> Iterator[None]:
        label = escape(f"{self.prefix}{name}")
        said = threading.Event()  # the start line was printed: the end line follows

        def say_start() -> None:
            with _lock:
                if said.is_set():
                    return
                said.set()
            info(f"[cyan]▸[/] {label} …")

        late: threading.Timer | None = None
        if not quiet and _verbose:
            say_start()
        elif not quiet and self.shown:
            late = threading.Timer(LONG_STEP_S, say_start)
            late.daemon = True
            late.start()
        started = time.perf_counter()
        try:
            yield
        except BaseException:
            elapsed = time.perf_counter() - started
            self.durations[name] = elapsed
            info(f"[red]✗[/] {label} failed after {format_seconds(elapsed)}")
            raise
        finally:
            if late is not None:
                late.cancel()
        elapsed = time.perf_counter() - started
        self.durations[name] = elapsed
        with _lock:
            ended = said.is_set()
            said.set()  # a start that fires now is not said
        if ended:
            info(f"[green]✓[/] {label} [dim]{format_seconds(elapsed)}[/]")


def _progress_disabled() -> bool:
    return not err.is_terminal and os.environ.get("ETLAB_PROGRESS") != "1"


def transfer_progress() -> Progress:
    """A progress display showing bytes, MB/s and elapsed time, for pushes and pulls."""
    return Progress(
        TextColumn("[cyan]{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=_progress_disabled(),
    )


class _StepOrTransfer(ProgressColumn):
    """A step row (its `step` field: what it is doing now) or a transfer row (bar, bytes, speed)."""

    def __init__(self) -> None:
        super().__init__()
        self.transfer = (BarColumn(), DownloadColumn(binary_units=True), TransferSpeedColumn())

    def render(self, task: Task) -> Any:
        if "step" in task.fields:
            return Text(str(task.fields["step"]), style="dim")
        grid = Table.grid(padding=(0, 1))
        grid.add_row(*(column(task) for column in self.transfer))
        return grid


class _StepsProgress(Progress):
    """A transfer row goes once its transfer is done: the step rows stay, each ending with its cell's outcome."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table([task for task in self.tasks if "step" in task.fields or not task.finished])


def steps_progress() -> Progress:
    """deploy-and-profile's live display: a row per board × variant saying its current step (push, run, pull,
    analyze) and its time, and a row per transfer while it runs. Disabled when stderr is not a terminal (then each
    finished board × variant is one line, see deploy/cells.py)."""
    return _StepsProgress(
        TextColumn("{task.description}"),
        _StepOrTransfer(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=_progress_disabled(),
    )


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    caption: str | None = None,
    fold: Sequence[str] = (),
    whole: Sequence[str] = (),
) -> None:
    """Print a table to stdout. Numeric columns are right-aligned; the `fold` columns (paths) wrap where too long
    instead of ending in an ellipsis; the `whole` columns (short compact figures) keep each cell on one line, the
    other columns narrowing for them."""
    grid = Table(
        title=_text(title) if title is not None else None,
        caption=_text(caption) if caption is not None else None,
        header_style="bold",
        title_justify="left",
    )
    for index, column in enumerate(columns):
        numeric = bool(rows) and all(isinstance(row[index], int | float) for row in rows if row[index] is not None)
        overflow: OverflowMethod = "fold" if column in fold else "ellipsis"
        widest = max((len(_cell(row[index])) for row in rows), default=0) if column in whole else None
        grid.add_column(
            _text(column), justify="right" if numeric else "left", overflow=overflow, no_wrap=column in whole,
            min_width=widest,
        )  # fmt: skip
    for row in rows:
        grid.add_row(*(_text(_cell(value)) for value in row))
    with _lock:
        out.print(grid)


def details(title: str, entries: Sequence[tuple[str, str | None, str]]) -> None:
    """Under a table: (name, stage, whole text) per entry, every line kept, for reasons a table cell cuts short."""
    with _lock:
        out.print(f"[bold]{_text(title)}[/]")
        for name, where, text in entries:
            heading = f"{name} ({where})" if where else name
            out.print(f"[bold red]{_text(heading)}[/]:")
            for line in text.splitlines() or [""]:
                out.print(f"  {_text(line)}", soft_wrap=True)


def _text(value: str) -> str:
    """Outside text as inert markup: no control characters, no rich tags."""
    return escape(inert(value))


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
    return str(value)


def quiet_third_party() -> None:
    """Silence import-time chatter of torch/torchao that says nothing actionable to etlab users."""
    import logging
    import warnings

    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    logging.getLogger("torch.export.pt2_archive._package").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
    warnings.showwarning = _show_warning


# The libraries etlab drives: their warnings are about their internals (torch.export's side effects in a KV cache,
# ExecuTorch's mutable buffers), which etlab handles; a user reads them with --verbose. A user's own code warns as it
# always does.
_LIBRARY_PARTS = {"torch", "executorch", "transformers", "torchao", "torchvision", "huggingface_hub", "safetensors"}
_default_showwarning = warnings_module.showwarning


def _show_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    parts = Path(filename).parts
    after = parts[parts.index("site-packages") + 1 :] if "site-packages" in parts else ()
    if after and after[0] in _LIBRARY_PARTS:
        detail(f"{category.__name__} from {Path(filename).name}:{lineno}: {str(message).splitlines()[0][:200]}")
        return
    _default_showwarning(message, category, filename, lineno, file, line)
