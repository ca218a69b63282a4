"""Command-line values checked on the workstation before a task deletes, connects or starts anything.

One function per kind of value. Each takes the raw option (a string from the command line) and returns it parsed,
or raises UsageError (exit 64) naming the option; `task` makes the tasks, so that every value reaches its check. This
is the edge: below the command layer the library gets only values checked here (or by the inventory's checker,
config.py), and names no option in its errors.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

import fabric
from invoke.parser import Argument

from orchestrator import console
from orchestrator.config import did_you_mean
from orchestrator.counters import parse_counters
from orchestrator.deploy.limits import MAX_COUNT, MAX_SECONDS, MAX_THREADS
from orchestrator.errors import UsageError
from orchestrator.lowering.weights import WEIGHT_MODES
from orchestrator.names import is_night
from orchestrator.results.summary_outputs import ACCURACY_DEFAULTS
from orchestrator.results.trace import FIRST, MEDIAN, Execution

__all__ = ["ACCURACY_DEFAULTS", "MAX_THREADS", "WEIGHT_MODES", "UsageError"]  # what tasks and tests read here
MAX_KEEP = 1_000_000
MAX_AB_ROUNDS = 1000
_RUN_ID = re.compile(r"[A-Za-z0-9._-]+")  # as the board agent names bundle folders


# The short flags, one meaning in every task. Invoke would give each option the first letter of its name no other
# option of that task took: `-b` was --board in five tasks and --backend in four, `-h` --history, --host or --threads,
# and a digit too (`--min-top1` got `-1`, and `--new-tokens -1` then read as that flag). Every other option is long.
SHORT_FLAGS = {
    "board": "b", "model": "m", "group": "g", "tag": "t", "inventory": "i", "run": "r", "quantize": "q",
    "spec": "s", "jobs": "j", "port": "p", "force": "f", "verbose": "v",
}  # fmt: skip
VERBOSE_HELP = "every step's start and end (prepare, push, save, ...): by default only long steps and a summary"


class Task(fabric.Task):
    """Fabric's task whose short flags are SHORT_FLAGS' alone: the same letter means the same option everywhere, and
    `-h` is only ever help."""

    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        long_names = [flag for flag in opts["names"] if len(flag) > 1]
        short = SHORT_FLAGS.get(name)
        opts["names"] = long_names + ([short] if short is not None else [])
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        """The body's options and `-v`/`--verbose`, which every task takes (the console's, set before the body)."""
        arguments: list[Argument] = super().get_arguments(ignore_unknown_help)
        if not any(argument.name == "verbose" for argument in arguments):
            arguments.append(Argument(names=("verbose", "v"), kind=bool, default=False, help=VERBOSE_HELP))
        return arguments

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        console.set_verbose(bool(kwargs.pop("verbose", False)))
        return super().__call__(*args, **kwargs)


def _help_for_tasks_with_positionals() -> None:
    """`fab compare --help` prints compare's help. Invoke's parser hands a task's missing positional argument any
    token, `--help` included, before it looks for core flags (invoke/parser/parser.py, `ParseMachine.handle`), so the
    help of a task with positional arguments failed ("did not receive required positional arguments")."""
    from invoke.parser.parser import ParseMachine

    original = ParseMachine.see_positional_arg
    if getattr(original, "etlab", False):
        return

    def see_positional_arg(self: Any, value: str) -> None:
        flag = self.initial.flags.get(value) if self.initial is not None else None
        if flag is not None and flag.name == "help" and self.context is not None:
            flag.value = self.context.name  # as ParseMachine.handle does for --help after a task without positionals
            for missing in self.context.missing_positional_args:  # never run: the help is printed instead
                missing.value = ""
            return
        original(self, value)

    see_positional_arg.etlab = True  # type: ignore[attr-defined]
    ParseMachine.see_positional_arg = see_positional_arg  # type: ignore[method-assign]


_help_for_tasks_with_positionals()


def task(*args: Any, **kwargs: Any) -> Any:
    """`fabric.task`, making a `Task` (short flags letters only)."""
    return fabric.task(*args, klass=Task, **kwargs)


def given(arguments: dict[str, Any]) -> dict[str, Any]:
    """A task body's arguments (its `locals()` before anything else) as the options given: the context left out."""
    return {name: value for name, value in arguments.items() if name != "c"}


GroupT = TypeVar("GroupT", bound="OptionGroup")


class OptionGroup:
    """A few options that make one typed value (the boards, the run, the accuracy gate, ...): a dataclass whose
    fields are the options' names, so a task with many options hands each group its own and forgets none."""

    @classmethod
    def take(cls: type[GroupT], arguments: dict[str, Any]) -> GroupT:
        """The group's options out of `arguments` (a task's options by name), removed from it."""
        names = [item.name for item in fields(cls)]  # type: ignore[arg-type]
        return cls(**{name: arguments.pop(name) for name in names if name in arguments})


def all_taken(arguments: dict[str, Any]) -> None:
    """What no group took is an option a task declares and never reads: a bug, said as one."""
    if arguments:
        raise AssertionError(f"options no group takes: {', '.join(sorted(arguments))}")


def count(option: str, value: Any, *, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """A whole number in [minimum, maximum]; "5.0", "1e3", "abc" and booleans are refused."""
    if isinstance(value, bool | float):
        raise UsageError(f"{option} must be a whole number from {minimum} to {maximum}, got {value!r}")
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip()
        try:
            number = int(text, 10)
        except ValueError:
            raise UsageError(f"{option} must be a whole number from {minimum} to {maximum}, got {value!r}") from None
    if not minimum <= number <= maximum:
        raise UsageError(f"{option} must be a whole number from {minimum} to {maximum}, got {number}")
    return number


def seconds(option: str, value: Any, *, allow_zero: bool = True, maximum: float = MAX_SECONDS) -> float:
    """A finite duration in seconds: NaN and infinities are refused (a NaN timeout would never fire)."""
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(value, bool):
        raise UsageError(f"{option} must be a number of seconds {bound}, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{option} must be a number of seconds {bound}, got {value!r}") from None
    if not math.isfinite(number):
        raise UsageError(f"{option} must be a finite number of seconds, got {value!r}")
    if number < 0 or (number == 0 and not allow_zero):
        raise UsageError(f"{option} must be a number of seconds {bound}, got {value!r}")
    if number > maximum:
        raise UsageError(f"{option} must be at most {maximum:.0f} seconds, got {value!r}")
    return number


def port(value: Any, option: str = "--port") -> int:
    """A TCP port to listen on, 1-65535."""
    return count(option, value, minimum=1, maximum=65535)


def weights(value: Any) -> str:
    """`--weights`: auto, pretrained or random."""
    if value not in WEIGHT_MODES:
        meant = did_you_mean(str(value), WEIGHT_MODES)
        raise UsageError(f"--weights must be one of {', '.join(WEIGHT_MODES)}, got {value!r}{meant}")
    return str(value)


def keep(value: Any) -> int:
    """`gc --keep`: how many bundles each board keeps."""
    return count("--keep", value, minimum=0, maximum=MAX_KEEP)


def run_id(value: Any, option: str = "--run") -> str:
    """A run id or a prefix of one: letters, digits, `.`, `_`, `-`."""
    text = str(value).strip()
    if isinstance(value, bool) or not _RUN_ID.fullmatch(text):
        raise UsageError(f"{option} must be a run id (letters, digits, '.', '_', '-'), got {value!r}")
    return text


def ab_rounds(value: Any, option: str = "--interleave") -> int:
    """`compare --interleave N`: 0 (no re-test) or the rounds of the interleaved A/B re-test, at least the sign
    test's minimum (abtest.MIN_ROUNDS: fewer rounds never confirm anything)."""
    from orchestrator.deploy.abtest import MIN_ROUNDS  # here, not at the top: it imports numpy

    rounds = count(option, value, minimum=0, maximum=MAX_AB_ROUNDS)
    if 0 < rounds < MIN_ROUNDS:
        raise UsageError(
            f"{option} must be a number of rounds from {MIN_ROUNDS} to {MAX_AB_ROUNDS} (0: no re-test), got {rounds}"
        )
    return rounds


def counters(value: Any) -> tuple[str, ...] | None:
    """`--counters [LIST]`: None when not asked for; the flag alone (or "default") is the default set."""
    if value is None or value is False:
        return None
    try:
        return parse_counters(None if value is True else str(value))
    except UsageError as exc:
        raise UsageError(f"--counters: {exc}") from None


NUMERICS_MODES = ("stats", "full")


def numerics(value: Any) -> Literal["stats", "full"] | None:
    """`--numerics [stats|full]`: None when not asked for; the flag alone is statistics per tensor."""
    if value is None or value is False:
        return None
    if value is True or value == "stats":
        return "stats"
    if value == "full":
        return "full"
    raise UsageError(
        f"--numerics takes stats (the default: statistics per tensor) or full (the tensors too), got {value!r}"
    )


def fraction(option: str, value: Any) -> float:
    """A finite number in [0, 1] (top-1 agreement, top-5 overlap thresholds)."""
    if isinstance(value, bool):
        raise UsageError(f"{option} must be a number from 0 to 1, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{option} must be a number from 0 to 1, got {value!r}") from None
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise UsageError(f"{option} must be a number from 0 to 1, got {value!r}")
    return number


def decibels(option: str, value: Any) -> float:
    """A finite signal-to-noise threshold in dB (may be negative: a loose gate)."""
    if isinstance(value, bool):
        raise UsageError(f"{option} must be a number of dB, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{option} must be a number of dB, got {value!r}") from None
    if not math.isfinite(number) or abs(number) > 1000:
        raise UsageError(f"{option} must be a finite number of dB (-1000..1000), got {value!r}")
    return number


def accuracy_thresholds(min_sqnr: Any = None, min_top1: Any = None, min_top5: Any = None) -> dict[str, float]:
    """The accuracy gate's thresholds: the documented defaults, overridden by the options given."""
    thresholds = dict(ACCURACY_DEFAULTS)
    if min_sqnr is not None:
        thresholds["min_sqnr_db"] = decibels("--min-sqnr", min_sqnr)
    if min_top1 is not None:
        thresholds["min_top1_agreement"] = fraction("--min-top1", min_top1)
    if min_top5 is not None:
        thresholds["min_top5_overlap"] = fraction("--min-top5", min_top5)
    return thresholds


@dataclass(frozen=True)
class TrialOptions:
    """`fab advise --try` and what goes with it, checked here (commands/advise.py takes it)."""

    rounds: int
    retest_seconds: float
    each: bool = False  # one A/B per rewrite too
    inventory: str | None = None
    trust_code: bool = False  # the command line's permissions to run code when the trial lowers the model again
    trust_remote_code: bool = False


def advice_trial(
    try_: bool, each: bool, rounds: Any, retest_seconds: Any, inventory: str | None
) -> TrialOptions | None:
    """`fab advise --try [--each] [--rounds N] [--retest-seconds S]`: the trial's options, or None without --try (then
    none of them may be given)."""
    from orchestrator.deploy.abtest import DEFAULT_RETEST_SECONDS, DEFAULT_ROUNDS, MIN_ROUNDS  # imports numpy

    if not try_:
        given = [name for name, value in (("--each", each), ("--rounds", rounds), ("--retest-seconds", retest_seconds))
                 if value not in (None, False)]  # fmt: skip
        if given:
            raise UsageError(f"{', '.join(given)}: only with --try", hint="add --try")
        return None
    # the sign test's minimum: fewer rounds never confirm anything
    chosen = DEFAULT_ROUNDS if rounds is None else count("--rounds", rounds, minimum=MIN_ROUNDS, maximum=MAX_AB_ROUNDS)
    budget = DEFAULT_RETEST_SECONDS if retest_seconds is None else seconds("--retest-seconds", retest_seconds)
    return TrialOptions(each=bool(each), rounds=chosen, retest_seconds=budget, inventory=inventory)


def output_folder(value: Any, option: str) -> Path:
    """A folder to write into: a path that is not an existing file (created when missing)."""
    if isinstance(value, bool) or not str(value).strip():
        raise UsageError(f"{option} must name a folder to write into, got {value!r}")
    folder = Path(str(value)).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{option} {str(folder)!r} is a file, not a folder")
    return folder


MODULE_GROUPING = "module"


def grouping(value: Any, option: str = "--by") -> int | None:
    """`module` (each module's own time) or `module:DEPTH` (rolled up to DEPTH >= 1 components): the depth."""
    text = str(value).strip()
    kind, _, depth = text.partition(":")
    if kind != MODULE_GROUPING or (_ and not depth):
        raise UsageError(f"{option} must be module or module:DEPTH (DEPTH a whole number from 1), got {value!r}")
    return count(option, depth, minimum=1, maximum=64) if depth else None


def execution(value: Any, option: str = "--execution") -> Execution:
    """Which execution the timeline draws: `median` (the one nearest the median, the default), `first`, or N (the
    Nth measured iteration, a text generation's decode step N, counted from 1)."""
    text = "" if isinstance(value, bool) else str(value).strip().lower()
    if text == MEDIAN:
        return MEDIAN
    if text == FIRST:
        return FIRST
    if text.isdigit() and int(text) >= 1:
        return count(option, text, minimum=1)
    raise UsageError(f"{option} must be median, first or a whole number from 1 (the Nth execution), got {value!r}")


def night(value: Any) -> str:
    """`--night`: a date spelled YYYY-MM-DD, the one spelling (the history, the reports and the night's lock are
    named by it: 20310101 and 2031-W01-3 would make one date several nights)."""
    text = "" if isinstance(value, bool) else str(value).strip()
    if is_night(text):
        return text
    try:
        meant = f" (did you mean {dt.date.fromisoformat(text).isoformat()}?)"
    except ValueError:
        meant = ""
    raise UsageError(f"--night must be a date spelled YYYY-MM-DD, e.g. 2026-11-30, got {value!r}{meant}")


def history(value: Any, option: str = "--history") -> str:
    """`--history`: a history URL, checked without connecting (history.check_url): exit 64 with the accepted forms."""
    # here, not at the top: it loads SQLAlchemy, which fab's start-up (every task) does not need
    from orchestrator.lab.history_url import HISTORY_FORMS, BadHistoryUrl, check_url, shown_url

    text = "" if isinstance(value, bool) else str(value).strip()
    try:
        return check_url(text)
    except BadHistoryUrl as exc:
        raise UsageError(f"{option} {shown_url(text)!r}: {exc}", hint=f"a history is {HISTORY_FORMS}") from None
