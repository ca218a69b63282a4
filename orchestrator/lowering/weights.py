"""What `--weights` means for a spec, decided without importing torch, transformers or huggingface_hub.

`auto` is pretrained when the spec's source says they can be had now (its `ModelSource.pretrained`, with helpers here:
a local folder, the HuggingFace cache or a reachable hub; the torch hub cache; timm's weights in the HuggingFace
cache), and random otherwise. A source without one (`factory`) brings its own weights: "own". The lowering cache
is keyed on this resolved choice, so deciding it must stay cheap: it runs on every warm `fab lower` and
`fab deploy-and-profile`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from orchestrator.errors import SpecError
from orchestrator.lowering.spec import SOURCES, ModelSpec

WEIGHT_MODES = ("auto", "pretrained", "random")  # `--weights`, the nightly's `weights:`
OWN_WEIGHTS = "own"  # the resolved mode of a source whose modules bring their weights (a factory's)
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


@dataclass(frozen=True)
class Availability:
    """Whether a spec's pretrained weights can be had now, and why (not); `expected` is False when random is all
    the spec can have (no model_id, kwargs that change the model), so settling for random is nothing to warn about."""

    available: bool
    reason: str
    expected: bool = True


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
    return cached_hub_file(model_id, "config.json", revision)


def cached_hub_file(model_id: str, filename: str, revision: str = "main") -> Path | None:
    """`filename` of `model_id` in the hub cache, or None."""
    repo = hf_hub_cache() / "--".join(["models", *model_id.split("/")])
    ref = repo / "refs" / revision
    try:
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
    except OSError:
        return None
    if not commit or "/" in commit or commit in (".", ".."):
        return None
    found = repo / "snapshots" / commit / filename
    return found if found.is_file() else None


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: the hub must not be asked."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in _TRUE_VALUES


def pretrained_available(model_id: str) -> tuple[bool, str]:
    """Whether the pretrained weights of a HuggingFace checkpoint (an id or a folder) can be had without a long
    network timeout, and why not."""
    if os.path.isdir(model_id):
        return True, f"local folder {model_id}"
    if cached_config(model_id) is not None:
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


TIMM_WEIGHTS_FILE = "model.safetensors"  # the only format read: no unpickling


def cached_timm_weights(model: str) -> Path | None:
    """Weights of timm's `model` in the HuggingFace cache (`timm/<model>.<tag>`, any tag), or None. The builder then
    reads the file of the model's default tag, never from the network."""
    try:
        tagged = sorted(hf_hub_cache().glob(f"models--timm--{model}.*"))
        repos = [*tagged, hf_hub_cache() / f"models--timm--{model}"]
    except OSError:
        return None
    for repo in repos:
        found = cached_hub_file("timm/" + repo.name.removeprefix("models--timm--"), TIMM_WEIGHTS_FILE)
        if found is not None:
            return found
    return None


def resolve_weights(spec: ModelSpec, requested: str) -> WeightsChoice:
    """`auto` | `pretrained` | `random` (one of WEIGHT_MODES, checked where it was given) → the weights a lowering
    of `spec` uses now."""
    lookup = SOURCES[spec.model_source].pretrained
    if lookup is None:  # whatever was asked: the module comes with the weights its maker gave it
        return WeightsChoice(requested, OWN_WEIGHTS, f"the {spec.model_source}'s own")
    if requested != "auto":
        return WeightsChoice(requested, requested, "requested")
    found: Availability = lookup(spec)
    if found.available:
        return WeightsChoice(requested, "pretrained", found.reason)
    return WeightsChoice(requested, "random", found.reason, fallback=found.expected)
