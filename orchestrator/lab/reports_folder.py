"""A reports folder holds the reports of one history: `nightly-<night>.*` and `dashboard-<night>/` are named by the
night alone, so two histories sharing a folder would overwrite each other's nights. The first nightly to write a
folder names its history in `history.json` there (claim_folder); a nightly of another history is refused before it
runs anything (ReportsFolderTaken, exit 64), and a re-run of the same history rewrites only its own night.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.fsutil import atomic_write_json, read_json
from orchestrator.lab.history_url import describe_url, history_id
from orchestrator.strictjson import JsonDataError

OWNER_FILE = "history.json"  # in a reports folder: the history whose reports it holds


class ReportsFolderTaken(UsageError):
    """The reports folder holds the nightly reports of another history (exit 64: give each history its own)."""

    def __init__(self, message: str, marker: Path) -> None:
        super().__init__(message)
        self.marker = marker  # the folder's history.json: whose reports it holds


def claim_folder(folder: Path, history_url: str) -> None:
    """Make sure `folder` holds this history's reports: claimed by the first nightly to write there (history.json,
    created at once, so two nightlies starting together cannot both claim it); ReportsFolderTaken when another
    history holds it, before the nightly runs anything."""
    marker = folder / OWNER_FILE
    mine = history_id(history_url)
    if not marker.exists():
        folder.mkdir(parents=True, exist_ok=True)
        draft = folder / f".{OWNER_FILE}.{os.getpid()}"
        atomic_write_json(draft, {"schema": 1, "history": mine, "where": describe_url(history_url)})
        try:
            os.link(draft, marker)  # fails if another nightly claimed it meanwhile: its claim stands
        except FileExistsError:
            pass
        finally:
            draft.unlink(missing_ok=True)
    try:
        owner = read_json(marker)
    except (OSError, JsonDataError) as exc:
        raise JsonDataError(str(marker), f"cannot say whose reports {folder} holds ({exc})") from None
    if not isinstance(owner, dict) or not isinstance(owner.get("history"), str):
        raise JsonDataError(str(marker), f"cannot say whose reports {folder} holds (no history id)", "history")
    if owner["history"] != mine:
        raise ReportsFolderTaken(
            f"the reports folder {folder} holds the nightly reports of the history {owner.get('where') or '?'}; "
            f"this nightly's history is {describe_url(history_url)}: its reports of a night would overwrite theirs",
            marker,
        )
