"""What a program keeps outside its XNNPACK delegates, as one record: read from a .pte (programs/outside.py) and
recorded in the sidecar (lowering/sidecar.py `outside_delegates`). Light: a sidecar reader imports it."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.records import Count, Dimension


@dataclass(frozen=True)
class StoredTensor:
    """A constant held both outside the XNNPACK delegates and, byte for byte, inside one."""

    shape: tuple[Dimension, ...]
    bytes: Count


@dataclass(frozen=True)
class StoredTwice:
    bytes: Count
    tensors: tuple[StoredTensor, ...]  # largest first


@dataclass(frozen=True)
class OutsideDelegates:
    """What stays outside a program's delegates, as read from the .pte and as the sidecar records it (absent in older
    sidecars): `kernels`, the plan's real kernel calls by operator; `bookkeeping`, the lowered graph's nodes that emit
    none (memory planning, tuple access, views: lowering/export/delegation.py counts them, a .pte does not say);
    `stored_twice`, the constants held both outside the XNNPACK delegates and inside one (a tied embedding)."""

    kernel_calls: Count
    kernels: dict[str, Count]  # operator ("aten::embedding.out") → kernel calls, most common first
    bookkeeping: dict[str, Count]  # memory_planning, tuple_access, views
    stored_twice: StoredTwice

    @property
    def stored_twice_bytes(self) -> int:
        return self.stored_twice.bytes
