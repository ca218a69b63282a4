"""What a run accepts: the command line's options and the nightly matrix check against these.

A module of its own, with no imports, because `commands/options.py` reads it at every `fab` start.
"""

MAX_COUNT = 1_000_000  # iterations, warmup runs: far beyond any real run, well inside the runner's int
MAX_THREADS = 4096
MAX_SECONDS = 30 * 24 * 3600.0  # a month: a budget or timeout beyond it is a typo
