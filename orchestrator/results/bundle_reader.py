"""A pulled bundle's files, read and checked against its manifest before the analysis trusts them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import AnalysisError, BundleError
from orchestrator.fsutil import read_json, unreadable
from orchestrator.names import is_valid_name
from orchestrator.results.bundle import is_bundle_path, verify_bundle

REQUIRED_FILES = ("result_manifest.json", "run.json")


def read_optional_json(path: Path) -> tuple[Any, str | None]:
    if not path.is_file():
        return None, f"{path.name} is missing"
    try:
        return read_json(path), None
    except (OSError, ValueError) as exc:
        return None, unreadable(path, exc)


def read_required_json(path: Path) -> Any:
    if not path.is_file():
        raise AnalysisError(f"bundle {path.parent} is missing {path.name}")
    try:
        return read_json(path)
    except (OSError, ValueError) as exc:
        raise AnalysisError(unreadable(path, exc)) from None


def bundle_model_sha(run: dict[str, Any], manifest: dict[str, Any]) -> str | None:
    for source in (run, manifest):
        value = source.get("model_sha256") if isinstance(source, dict) else None
        if isinstance(value, str) and len(value) == 64:
            return value.lower()
    return None


@dataclass
class BundleFiles:
    """The raw bundle files analysis reads, and problems found reading them."""

    path: Path
    manifest: dict[str, Any]
    run: dict[str, Any]
    timings: dict[str, Any]
    board_before: dict[str, Any] | None
    board_after: dict[str, Any] | None
    notes: list[tuple[str, str]]

    @property
    def ran_ok(self) -> bool:
        return self.manifest.get("status") == "ok"

    @property
    def parameters(self) -> dict[str, Any]:
        """run.json's `parameters` (the profile's options), {} when the board wrote none or not a mapping."""
        parameters = self.run.get("parameters")
        return parameters if isinstance(parameters, dict) else {}

    @property
    def method(self) -> str:
        return str(self.timings.get("method") or self.parameters.get("method") or "forward")

    @property
    def etdump_requested(self) -> bool:
        return self.timings.get("etdump") is not False and self.parameters.get("etdump") is not False


def read_bundle(bundle_dir: Path) -> BundleFiles:
    if not bundle_dir.is_dir():
        raise AnalysisError(f"bundle folder {bundle_dir} does not exist")
    manifest = read_required_json(bundle_dir / "result_manifest.json")
    run = read_required_json(bundle_dir / "run.json")
    if not isinstance(manifest, dict) or not isinstance(run, dict):
        raise AnalysisError(f"bundle {bundle_dir}: result_manifest.json or run.json is not a JSON object")
    files = manifest.get("files")
    listed = files if isinstance(files, dict) else {}
    # Only names that pass the rule touch the disk; verify_bundle refuses the others by name.
    missing = sorted(name for name in listed if is_bundle_path(name) and not (bundle_dir / name).is_file())
    if missing:
        raise AnalysisError(f"bundle {bundle_dir} is missing {', '.join(missing)} (listed in result_manifest.json)")
    try:
        verify_bundle(bundle_dir)  # what the board wrote, byte for byte: a torn or edited file is refused
    except BundleError as exc:
        raise AnalysisError(str(exc)) from None
    _check_names(bundle_dir, manifest, run)
    notes: list[tuple[str, str]] = []
    timings, problem = read_optional_json(bundle_dir / "timings.json")
    if problem and manifest.get("status") == "ok":
        raise AnalysisError(f"bundle {bundle_dir}: {problem}")
    before, problem_before = read_optional_json(bundle_dir / "board_info_before.json")
    after, problem_after = read_optional_json(bundle_dir / "board_info_after.json")
    for problem in (problem_before, problem_after):
        if problem:
            notes.append(("degraded", f"board conditions unknown: {problem}"))
    return BundleFiles(
        bundle_dir,
        manifest,
        run,
        timings if isinstance(timings, dict) else {},
        before if isinstance(before, dict) else None,
        after if isinstance(after, dict) else None,
        notes,
    )


def _check_names(bundle_dir: Path, manifest: dict[str, Any], run: dict[str, Any]) -> None:
    """Names the board wrote end up in file names and reports: they must pass the name rule, every time."""
    labels = run.get("labels")
    if labels is not None and not isinstance(labels, dict):
        raise AnalysisError(f"bundle {bundle_dir}: run.json 'labels' is not a mapping")
    fields = {"result_manifest.json run_id": manifest.get("run_id"), "run.json run_id": run.get("run_id")}
    fields |= {f"run.json labels.{key}": (labels or {}).get(key) for key in ("model", "backend")}
    for field_name, value in fields.items():
        if value is not None and not is_valid_name(value):
            raise AnalysisError(
                f"bundle {bundle_dir}: {field_name} {str(value)[:80]!r} is not a valid name "
                "(letters, digits, '.', '_', '-'); the bundle is refused"
            )
