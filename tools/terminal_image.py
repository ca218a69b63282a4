"""A terminal's output as a picture for docs/images/: run a command (or read a saved output), draw it as rich draws a
terminal (its SVG export), and take a PNG of that in headless Chromium.

    .venv/bin/python tools/terminal_image.py docs/images/terminal-advice.png --title "fab advise" -- \
        .venv/bin/fab advise --run RUN_ID
    .venv/bin/python tools/terminal_image.py docs/images/deploy.png --from-file saved.txt --lines 40:80
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text


def terminal_svg(output: str, *, width: int, title: str) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(Text.from_ansi(output))  # a line past the width wraps, as in a terminal
    return console.export_svg(title=title)


def svg_to_png(svg: str, png: Path) -> None:
    from playwright.sync_api import sync_playwright  # here: only the picture needs a browser

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(device_scale_factor=1)
        page.set_content(f"<html><body style='margin:0;background:#fff'>{svg}</body></html>")
        page.locator("svg").first.screenshot(path=str(png))
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("png", type=Path)
    parser.add_argument("--title", default="etlab")
    parser.add_argument("--width", type=int, default=140)
    parser.add_argument("--from-file", type=Path, help="a saved output instead of running a command")
    parser.add_argument("--lines", help="FIRST:LAST (1-based, inclusive) of the output to draw")
    parser.add_argument("command", nargs="*")
    args = parser.parse_args()
    if args.from_file is not None:
        output = args.from_file.read_text()
    else:
        env = {**os.environ, "ETLAB_WIDTH": str(args.width), "COLUMNS": str(args.width)}
        done = subprocess.run(args.command, env=env, capture_output=True, text=True, check=False)
        output = done.stdout + done.stderr
    if args.lines:
        first, last = (int(part) for part in args.lines.split(":"))
        output = "\n".join(output.splitlines()[first - 1 : last])
    svg_to_png(terminal_svg(output, width=args.width, title=args.title), args.png)
    print(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
