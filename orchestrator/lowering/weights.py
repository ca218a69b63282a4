"""What `--weights` means for a spec, decided without importing torch, transformers or huggingface_hub.

`auto` is pretrained when the weights are a local folder, in the HuggingFace cache, or the hub is
reachable, and random otherwise. The lowering cache is keyed on this resolved choice, so deciding it
must stay cheap: it runs on every warm `fab lower` and `fab deploy-and-profile`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from orchestrator.errors import SpecError
from orchestrator.lowering.spec import ModelSpec

WEIGHT_MODES = ("auto", "pretrained", "random")  # `--weights`, the nightly's `weights:`
RANDOM_SEED = 0
HUB_PROBE_TIMEOUT_S = 2.0
# huggingface_hub's spelling of true for its environment switches.
_TRUE_VALUES = {"1", "ON", "YES", "TRUE"}


class PretrainedUnavailable(SpecError):
    """Pretrained weights were asked for and cannot be had; random weights can be (the command layer names how)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, hint="random weights build the architecture from its config")


@dataclass(frozen=True)
class WeightsChoice:
    """The resolved weights: `mode` is "pretrained" or "random"; `fallback` when `auto` had to settle for random."""

    requested: str
    mode: str
    reason: str
    fallback: bool = False


def hf_hub_cache() -> Path:
    """The HuggingFace hub cache folder, resolved from the environment as huggingface_hub does."""
    home = os.path.expandvars(
        os.path.expanduser(
            os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
        )
    )
    legacy = os.environ.get("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub"))
    return Path(os.path.expandvars(os.path.expanduser(os.environ.get("HF_HUB_CACHE", legacy))))


def cached_config(model_id: str, revision: str = "main") -> Path | None:
    """config.json of `model_id` in the hub cache, or None: the on-disk half of `try_to_load_from_cache`."""
    repo = hf_hub_cache() / "--".join(["models", *model_id.split("/")])
    ref = repo / "refs" / revision
    try:
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
    except OSError:
        return None
    if not commit or "/" in commit or commit in (".", ".."):
        return None
    config = repo / "snapshots" / commit / "config.json"
    return config if config.is_file() else None


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: the hub must not be asked."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in _TRUE_VALUES


def pretrained_available(spec: ModelSpec) -> tuple[bool, str]:
    """Whether pretrained weights can be had without a long network timeout, and why not."""
    if not spec.model_id:
        return False, "the spec has no model_id"
    if os.path.isdir(spec.model_id):
        return True, f"local folder {spec.model_id}"
    if cached_config(spec.model_id) is not None:
        return True, "found in the HuggingFace cache"
    if hub_offline():
        return False, "not in the HuggingFace cache and HF_HUB_OFFLINE is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S):
            return True, f"{host} is reachable"
    except OSError as exc:
        return False, f"not in the HuggingFace cache and {host} is unreachable ({exc.__class__.__name__}: {exc})"


def torch_hub_checkpoints() -> Path:
    """Where torch.hub keeps downloaded checkpoints ($TORCH_HOME/hub/checkpoints), resolved as torch.hub does."""
    home = os.environ.get("TORCH_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "torch")
    return Path(os.path.expanduser(home)) / "hub" / "checkpoints"


def cached_torchvision_checkpoint(model: str) -> Path | None:
    """A torchvision checkpoint of `model` in the torch hub cache (`<model>-<hash>.pth`, torchvision's naming), or
    None. The builder then loads the exact file of the model's default weights, never from the network."""
    folder = torch_hub_checkpoints()
    try:
        found = sorted(folder.glob(f"{model}-*.pth"))
    except OSError:
        return None
    return found[0] if found else None


def torchvision_pretrained(spec: ModelSpec) -> tuple[bool, str]:
    """Whether a torchvision spec can have its pretrained weights without the network, and why not."""
    if spec.kwargs:
        return False, f"the spec's kwargs ({', '.join(spec.kwargs)}) change the model torchvision's checkpoint fits"
    if cached_torchvision_checkpoint(spec.model_type) is None:
        return False, f"no {spec.model_type} checkpoint in {torch_hub_checkpoints()} (etlab never downloads one)"
    return True, f"found in {torch_hub_checkpoints()}"


def resolve_weights(spec: ModelSpec, requested: str) -> WeightsChoice:
    """`auto` | `pretrained` | `random` (one of WEIGHT_MODES, checked where it was given) → the weights a lowering
    of `spec` uses now."""
    if requested != "auto":
        return WeightsChoice(requested, requested, "requested")
    if spec.model_source == "torchvision":
        available, reason = torchvision_pretrained(spec)
        if available:
            return WeightsChoice(requested, "pretrained", reason)
        # kwargs that change the model (the tiny ones): random is all there is, and nothing to warn about.
        return WeightsChoice(requested, "random", reason, fallback=not spec.kwargs)
    if not spec.model_id:
        # No model_id (the tiny models): random is all there is, and nothing to warn about.
        return WeightsChoice(requested, "random", "the spec has no model_id")
    available, reason = pretrained_available(spec)
    if available:
        return WeightsChoice(requested, "pretrained", reason)
    return WeightsChoice(requested, "random", reason, fallback=True)
