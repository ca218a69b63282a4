"""Helpers shared by the board agent's tests (test_agent_*.py): the info document's schema, file digests, timestamps."""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from typing import Any

INFO_TYPES: dict[str, tuple[type, ...]] = {
    "schema": (int,),
    "collected_at": (str,),
    "hostname": (str,),
    "model": (str, type(None)),
    "arch": (str, type(None)),
    "cpu": (dict,),
    "cores_online": (int, type(None)),
    "cpufreq": (list,),
    "governor": (str, type(None)),
    "load_1m": (float, type(None)),
    "temperature_c": (float, type(None)),
    "temperature_zone": (str, type(None)),
    "thermal_zones": (list,),
    "vcgencmd_temp_c": (float, type(None)),
    "throttled": (dict, type(None)),
    "memory": (dict,),
    "kernel": (str, type(None)),
    "firmware": (str, type(None)),
    "config_txt": (dict, type(None)),
    "os_release": (str, type(None)),
    "python": (str,),
    "glibc": (str, type(None)),
    "state": (dict, type(None)),
    "runner": (dict, type(None)),
    "perf": (dict,),
    "lock_holder": (dict, type(None)),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def when(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def assert_info_schema(document: dict[str, Any]) -> None:
    assert set(document) == set(INFO_TYPES), set(document) ^ set(INFO_TYPES)
    for key, types in INFO_TYPES.items():
        assert isinstance(document[key], types), (key, document[key])
    assert set(document["memory"]) == {"total_kb", "available_kb"}
    assert set(document["cpu"]) == {"core", "midr", "hwcap", "aes"}
    for policy in document["cpufreq"]:
        assert set(policy) == {"policy", "cpus", "cur_khz", "min_khz", "max_khz", "hw_max_khz", "governor"}
    for zone in document["thermal_zones"]:
        assert set(zone) == {"zone", "type", "temp_c"}
