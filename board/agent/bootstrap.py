#!/usr/bin/env python3
"""Unpack the click wheel into <wd>/pylib before the agent (which needs click) can run.

Standard library only:  python3 board/agent/bootstrap.py --wheel click-8.1.8-py3-none-any.whl --dest ~/.etlab/pylib
Prints one JSON document, like the agent: {"dest", "files", ...} or {"error", "exit_code"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from etlab_agent.errors import AgentError
from etlab_agent.wheel import unpack_wheel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", required=True, help="path to the click wheel")
    parser.add_argument("--dest", required=True, help="folder to unpack into (replaced as a whole), e.g. <wd>/pylib")
    args = parser.parse_args()
    try:
        result = unpack_wheel(args.wheel, args.dest)
    except AgentError as exc:
        print(json.dumps({"error": str(exc), "exit_code": exc.exit_code, **exc.details}))
        return exc.exit_code
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
