"""The figures every table and line prints: a time never in an exponent, a small share never 0%."""

from __future__ import annotations

import pytest

from orchestrator.console import format_ms, format_share


@pytest.mark.parametrize(
    ("ms", "said"),
    [(1180.4, "1,180 ms"), (3.6, "3.6 ms"), (0.1234, "0.123 ms"), (0.0004, "0.4 µs"), (0.0, "0 ms"),
     (-12.5, "-12.5 ms"), (254_000.0, "254,000 ms")],
)  # fmt: skip
def test_a_time_reads_without_an_exponent(ms: float, said: str) -> None:
    assert format_ms(ms) == said and "e+" not in said


@pytest.mark.parametrize(
    ("share", "said"), [(0.0036, "<1%"), (0.0, "0%"), (0.31, "31%"), (0.005, "<1%"), (-0.002, ">-1%")]
)
def test_a_small_share_is_never_zero(share: float, said: str) -> None:
    assert format_share(share) == said


def test_the_libraries_warnings_wait_for_verbose_and_yours_do_not() -> None:
    """torch.export's warning about a KV cache's side effects (what `deploy-and-profile` of a generation model
    printed) is etlab's to handle: said with --verbose only. A warning from the user's own code still shows."""
    import subprocess
    import sys

    from orchestrator.paths import PROJECT_ROOT

    script = (
        "import warnings, sys\n"
        "from orchestrator import console\n"
        "console.quiet_third_party()\n"
        "console.set_verbose(sys.argv[1] == 'verbose')\n"
        "site = '/venv/lib/python3.11/site-packages'\n"
        "warnings.warn_explicit('side effects in model.forward', UserWarning, site + '/torch/_dynamo/g.py', 1)\n"
        "warnings.warn_explicit('Mutation on a buffer', UserWarning, site + '/executorch/exir/emit/e.py', 2)\n"
        "warnings.warn_explicit('your layer is odd', UserWarning, '/home/me/my_model.py', 3)\n"
    )
    said = {
        mode: subprocess.run([sys.executable, "-c", script, mode], cwd=PROJECT_ROOT, capture_output=True, text=True)
        for mode in ("quiet", "verbose")
    }
    quiet, verbose = (" ".join((said[mode].stdout + said[mode].stderr).split()) for mode in ("quiet", "verbose"))
    assert "your layer is odd" in quiet and "side effects" not in quiet and "Mutation on a buffer" not in quiet
    assert "your layer is odd" in verbose and "side effects" in verbose and "Mutation on a buffer" in verbose
