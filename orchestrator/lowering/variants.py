"""What a lowering makes: a backend and a quantization scheme, typed, and the one rule that names it on disk.

A `Variant` is built once where a choice is parsed (the CLI's `--backend`/`--quantize`, the nightly matrix) and
read back once with `Variant.parse` where its name comes back from disk (a sidecar, a bundle label, a summary).
The names are the artifacts' backend names, unchanged: `portable`, `xnnpack` and `xnnpack-<scheme>` for every
quantized scheme of the registry (quantize.SCHEMES). Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.config import did_you_mean
from orchestrator.lowering.quantize.schemes import FP32, SCHEMES, Scheme

# Lowering seconds of a backend's fp32 program relative to fp32 XNNPACK (bench/README.md).
_BACKEND_COST = {"portable": 0.5, "xnnpack": 1.0}
QUANTIZED_ON = "xnnpack"  # quantized programs are XNNPACK programs


class UnknownVariant(ValueError):
    """A name that is no variant of this etlab (a typo, or a file from another version)."""


@dataclass(frozen=True)
class Variant:
    """One program to lower, push and run: `backend` (portable or xnnpack) with `scheme` (FP32: not quantized)."""

    backend: str
    scheme: Scheme = FP32

    def __post_init__(self) -> None:
        if self.backend not in _BACKEND_COST:
            raise UnknownVariant(f"unknown backend {self.backend!r}; backends: {', '.join(_BACKEND_COST)}")
        if self.scheme.quantized and self.backend != QUANTIZED_ON:
            raise UnknownVariant(f"{self.scheme.name} programs are {QUANTIZED_ON} programs, not {self.backend}")

    @property
    def name(self) -> str:
        """The artifact backend name: `xnnpack-int8-dynamic`; `portable` and `xnnpack` for fp32."""
        return f"{self.backend}-{self.scheme.name}" if self.scheme.quantized else self.backend

    @property
    def quantized(self) -> bool:
        return self.scheme.quantized

    @property
    def peers(self) -> tuple[Variant, ...]:
        """The programs whose runs measure what quantizing this one would save: its scheme's peers, in order."""
        return tuple(Variant(QUANTIZED_ON, SCHEMES[name]) for name in self.scheme.peers)

    @property
    def relative_cost(self) -> float:
        """Lowering seconds relative to fp32 XNNPACK, for the order of a parallel lowering."""
        return _BACKEND_COST[self.backend] * self.scheme.relative_cost

    @classmethod
    def parse(cls, name: str) -> Variant:
        """The variant an artifact backend name stands for; UnknownVariant names the known ones."""
        variant = VARIANTS.get(name) if isinstance(name, str) else None
        if variant is None:
            raise UnknownVariant(f"unknown backend {name!r}; backends: {', '.join(VARIANTS)}")
        return variant

    def __str__(self) -> str:
        return self.name


VARIANTS: dict[str, Variant] = {
    variant.name: variant
    for variant in (
        *(Variant(backend) for backend in _BACKEND_COST),
        *(Variant(QUANTIZED_ON, scheme) for scheme in SCHEMES.values() if scheme.quantized),
    )
}
BACKENDS = tuple(VARIANTS)  # every artifact backend name
QUANTIZED_BACKENDS = tuple(name for name, variant in VARIANTS.items() if variant.quantized)


def parse_schemes(names: Iterable[str]) -> tuple[Scheme, ...]:
    """Scheme names → schemes of the registry, order kept, no duplicates; none given means fp32 alone."""
    names = list(dict.fromkeys(names))
    unknown = [name for name in names if name not in SCHEMES]
    if unknown:
        meant = did_you_mean(unknown[0], SCHEMES)
        raise UnknownVariant(f"unknown scheme {', '.join(unknown)}{meant}; choose from: {', '.join(SCHEMES)}")
    return tuple(SCHEMES[name] for name in names) or (FP32,)


def combine(backends: Sequence[Variant], schemes: Sequence[Scheme]) -> tuple[Variant, ...]:
    """The variants `--backend B --quantize S` (or a matrix entry's `backends` and `quantize`) ask for.

    fp32 among the schemes keeps the backends as given; every quantized scheme adds its XNNPACK program. A backend
    that names a quantized variant directly is kept either way. Order kept, no duplicates.
    """
    chosen = [variant for variant in backends if FP32 in schemes or variant.quantized]
    chosen += [Variant(QUANTIZED_ON, scheme) for scheme in schemes if scheme.quantized]
    return tuple(dict.fromkeys(chosen))
