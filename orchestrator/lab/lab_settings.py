"""The inventory's `lab:` section: where a lab's scheduler listens, its certificates, its shared artifact store.

Without it (the default) a night runs in `fab nightly`'s own process, as it always has. With it, `fab nightly`
hands the night to the lab's workers (lab/lab_night.py) and `fab worker` joins the lab (lab/cluster.py).

```yaml
lab:
  scheduler: tls://lab-host.example:8786   # tls:// (mutual TLS with the lab's certificates), or tcp:// on loopback
  certificates: lab-certs/                  # from `fab lab-certs`: ca.pem, lab.pem (the lab's key and certificate)
  store: /srv/etlab-store                   # a shared folder, or an fsspec URL (s3://bucket/etlab, ...)
  wait_seconds: 600                         # how long a board's cells wait for a worker that reaches the board
  lowering_gb: 4                            # memory a lowering needs: it runs only where that much is free
  worker_ttl_seconds: 60                    # a worker silent this long (frozen, cut off) is given up, its work moved
  listen: 192.0.2.10                        # where workers listen for peers (default: the interface that reaches
                                            # the scheduler)
```
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from yaml.nodes import Node

from orchestrator.boards.inventory import Inventory, path_in_file
from orchestrator.config import Checker, Invalid, number, string
from orchestrator.errors import InventoryError
from orchestrator.names import is_loopback

DEFAULT_WAIT_SECONDS = 600.0
DEFAULT_LOWERING_GB = 2.0
DEFAULT_WORKER_TTL_SECONDS = 60.0
CA_FILE, KEY_AND_CERT_FILE = "ca.pem", "lab.pem"


@dataclass(frozen=True)
class LabSettings:
    scheduler: str  # tls://host:port or tcp://<loopback>:port
    store: str  # a folder (absolute) or an fsspec URL
    certificates: Path | None = None  # the folder holding ca.pem and lab.pem; required for tls://
    wait_seconds: float = DEFAULT_WAIT_SECONDS
    lowering_gb: float = DEFAULT_LOWERING_GB
    worker_ttl_seconds: float = DEFAULT_WORKER_TTL_SECONDS
    listen: str | None = None  # the host address workers listen on; None: the interface towards the scheduler

    @property
    def secure(self) -> bool:
        return self.scheduler.startswith("tls://")


def check_address(address: str) -> str:
    """A scheduler address etlab will listen on or dial: tls:// anywhere, tcp:// only on a loopback address (an open
    port without TLS would let anyone on the network run work on the lab's hosts)."""
    parsed = urllib.parse.urlsplit(address)
    if parsed.scheme not in ("tls", "tcp") or not parsed.hostname or parsed.path not in ("", "/"):
        raise Invalid(f"expected tls://HOST:PORT (or tcp://127.0.0.1:PORT on one host), got {address!r}")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if port is None or not 1 <= port <= 65535:
        raise Invalid(f"{address!r} has no port (1-65535)")
    if parsed.scheme == "tcp" and not is_loopback(parsed.hostname):
        raise Invalid(f"{address!r} would be an open port without TLS: use tls:// with `fab lab-certs`' certificates")
    return f"{parsed.scheme}://{parsed.hostname if ':' not in parsed.hostname else f'[{parsed.hostname}]'}:{port}"


def _address(node: Node, _field: str) -> str:
    return check_address(string(node, "a scheduler address"))


def load_lab_settings(inventory: Inventory, *, scheduler: str | None = None) -> LabSettings | None:
    """The `lab:` section, checked (`file:line: lab.scheduler: ...`, exit 64); None when there is none and no
    `scheduler` is given. `scheduler` (an option, already checked) overrides the file's."""
    node = inventory.lab_node
    checker = Checker(inventory.path)
    section = {} if node is None else checker.fields(node, "lab", _FIELDS)
    if checker.problems:
        raise InventoryError("\n".join(checker.errors))
    address = scheduler or section.get("scheduler")
    if address is None:
        if node is not None:
            checker.error(node, "lab.scheduler", "is required: the lab's scheduler address (tls://HOST:PORT)")
            raise InventoryError("\n".join(checker.errors))
        return None
    missing = []
    if "store" not in section:
        missing.append(("lab.store", "is required: the folder or URL every host shares for programs"))
    if address.startswith("tls://") and "certificates" not in section:
        missing.append(("lab.certificates", "is required for a tls:// scheduler: the folder `fab lab-certs` wrote"))
    if missing:
        if node is None:  # only --scheduler given: no section to point at
            raise InventoryError("\n".join(f"{inventory.path}: {field_name}: {why}" for field_name, why in missing))
        for field_name, why in missing:
            checker.error(node, field_name, why)
        raise InventoryError("\n".join(checker.errors))
    certificates = path_in_file(inventory.path, section["certificates"]) if "certificates" in section else None
    store = section["store"]
    return LabSettings(
        scheduler=address,
        store=store if "://" in store else str(path_in_file(inventory.path, store)),
        certificates=certificates,
        wait_seconds=section.get("wait_seconds", DEFAULT_WAIT_SECONDS),
        lowering_gb=section.get("lowering_gb", DEFAULT_LOWERING_GB),
        worker_ttl_seconds=section.get("worker_ttl_seconds", DEFAULT_WORKER_TTL_SECONDS),
        listen=section.get("listen"),
    )


def _text(node: Node, _field: str) -> str:
    value = string(node, "a path or URL")
    if not value or "\0" in value:
        raise Invalid("expected a non-empty path or URL")
    return value


def _listen(node: Node, _field: str) -> str:
    value = string(node, "an address of this host")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise Invalid(f"expected an IP address of this host (workers listen there), got {value[:80]!r}") from None


_FIELDS = {
    "scheduler": _address,
    "certificates": _text,
    "store": _text,
    "wait_seconds": number(0, above=True, high=7 * 86400, unit="a number of seconds"),
    "lowering_gb": number(0, above=True, high=1 << 20, unit="a number of GB"),
    # Dask's heartbeats come every 0.5-5 s: below 5 s a busy worker would be taken for a frozen one.
    "worker_ttl_seconds": number(5, high=86400, unit="a number of seconds"),
    "listen": _listen,
}
