// The page of the browser backends: loads onnxruntime-web on demand, creates sessions from the
// model files the server serves, runs them on base64-encoded tensors, and reports where ONNX
// Runtime placed the nodes (its verbose session log). Every entry point resolves to a JSON string
// {ok: true, ...} or {ok: false, error}; nothing rejects.

const logs = [];
for (const level of ["log", "info", "warn", "error", "debug"]) {
  const original = console[level].bind(console);
  console[level] = (...args) => {
    logs.push(args.map((a) => String(a)).join(" "));
    if (logs.length > 50000) logs.splice(0, 10000);
    original(...args);
  };
}

const modules = {};
const sessions = new Map();

// WebNN graph builds that fail. onnxruntime-web 1.30 never settles a session whose WebNN graph
// MLGraphBuilder.build rejects (e.g. Chromium's "gatherElements only supports constant indices"),
// so `create` listens for these and fails at once with the browser's reason.
const buildListeners = new Set();
if (self.MLGraphBuilder && MLGraphBuilder.prototype.build) {
  const build = MLGraphBuilder.prototype.build;
  MLGraphBuilder.prototype.build = function (...args) {
    const built = build.apply(this, args);
    built.catch((e) => {
      for (const listener of buildListeners) listener(e);
    });
    return built;
  };
}

// Settles with `work`, or rejects (kind "graph-build") as soon as a WebNN graph build fails.
async function failingOnBuild(work) {
  let listener;
  const failed = new Promise((_, reject) => {
    listener = (e) => {
      const error = new Error("MLGraphBuilder.build rejected the graph: " + message(e));
      error.kind = "graph-build";
      reject(error);
    };
  });
  buildListeners.add(listener);
  try {
    return await Promise.race([work, failed]);
  } finally {
    buildListeners.delete(listener);
  }
}

function bundleFor(provider) {
  // The dedicated WebGPU bundle (native WebGPU provider); the JSEP bundle for WebNN and wasm.
  return provider === "webgpu" ? "ort.webgpu.min.mjs" : "ort.min.mjs";
}

async function ortFor(provider, threads) {
  const file = bundleFor(provider);
  if (!modules[file]) {
    modules[file] = import("/ort/" + file).then((ort) => {
      ort.env.wasm.wasmPaths = "/ort/";
      ort.env.wasm.numThreads = self.crossOriginIsolated ? threads : 1;
      ort.env.logLevel = "verbose";
      return ort;
    });
  }
  try {
    return await modules[file];
  } catch (e) {
    delete modules[file];
    throw new Error("cannot load /ort/" + file + ": " + message(e));
  }
}

function message(e) {
  return String((e && (e.message || e.reason)) || e);
}

function fromB64(text) {
  const s = atob(text);
  const bytes = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  return bytes;
}

function toB64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

const ARRAYS = {
  float32: Float32Array,
  float64: Float64Array,
  int64: BigInt64Array,
  int32: Int32Array,
  bool: Uint8Array,
  uint8: Uint8Array,
  int8: Int8Array,
};

// Placement lines of ONNX Runtime's verbose session log.
function placement(lines) {
  const nodes = {};
  for (const line of lines) {
    const m = /(?:All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)/.exec(line);
    if (m) nodes[m[1]] = (nodes[m[1]] || 0) + Number(m[2]);
  }
  return nodes;
}

async function guarded(work) {
  try {
    return JSON.stringify(Object.assign({ ok: true }, await work()));
  } catch (e) {
    return JSON.stringify({ ok: false, error: message(e), kind: (e && e.kind) || "" });
  }
}

function withTimeout(promise, ms, what) {
  return Promise.race([
    promise,
    new Promise((_, reject) => setTimeout(() => reject(new Error(what + " timed out")), ms)),
  ]);
}

window.ipfsAccel = {
  // Browser facts for `devices`: WebNN context support per device type, WebGPU adapter info.
  probe: () =>
    guarded(async () => {
      const webnn = {};
      for (const deviceType of ["cpu", "gpu", "npu"]) {
        try {
          if (!navigator.ml) throw new Error("navigator.ml is undefined");
          await withTimeout(navigator.ml.createContext({ deviceType }), 20000, "createContext");
          webnn[deviceType] = { ok: true };
        } catch (e) {
          webnn[deviceType] = { ok: false, error: message(e) };
        }
      }
      let webgpu;
      try {
        if (!navigator.gpu) throw new Error("navigator.gpu is undefined");
        const adapter = await withTimeout(navigator.gpu.requestAdapter(), 20000, "requestAdapter");
        if (!adapter) throw new Error("requestAdapter returned no adapter");
        const info = adapter.info || {};
        webgpu = {
          ok: true,
          vendor: info.vendor || "",
          architecture: info.architecture || "",
          device: info.device || "",
          description: info.description || "",
        };
      } catch (e) {
        webgpu = { ok: false, error: message(e) };
      }
      return {
        userAgent: navigator.userAgent,
        crossOriginIsolated: self.crossOriginIsolated,
        hardwareConcurrency: navigator.hardwareConcurrency,
        webnn,
        webgpu,
      };
    }),

  // Checks that the provider can run here: its onnxruntime-web bundle loads, a WebNN context of
  // the device type, a WebGPU adapter.
  check: (provider, deviceType, threads) =>
    guarded(async () => {
      await ortFor(provider, threads);
      if (provider === "webnn") {
        if (!navigator.ml) throw new Error("navigator.ml is undefined");
        await withTimeout(navigator.ml.createContext({ deviceType }), 20000, "createContext");
      } else if (provider === "webgpu") {
        if (!navigator.gpu) throw new Error("navigator.gpu is undefined");
        const adapter = await withTimeout(navigator.gpu.requestAdapter(), 20000, "requestAdapter");
        if (!adapter) throw new Error("requestAdapter returned no adapter");
      }
      return {};
    }),

  // Creates (once per key) a session of the model served at spec.model.
  create: (key, spec) =>
    guarded(async () => {
      if (sessions.has(key)) return { cached: true };
      const ort = await ortFor(spec.provider, spec.threads);
      const ep =
        spec.provider === "webnn" ? { name: "webnn", deviceType: spec.deviceType } : spec.provider;
      const response = await fetch(spec.model);
      if (!response.ok) throw new Error("fetching " + spec.model + ": HTTP " + response.status);
      const bytes = new Uint8Array(await response.arrayBuffer());
      const start = logs.length;
      const session = await failingOnBuild(
        ort.InferenceSession.create(bytes, {
          executionProviders: [ep],
          freeDimensionOverrides: spec.freeDimensionOverrides,
          graphOptimizationLevel: "all",
          logSeverityLevel: 0,
          logVerbosityLevel: 0,
        }),
      );
      const lines = logs.slice(start);
      sessions.set(key, { ort, session });
      return {
        inputs: session.inputNames,
        outputs: session.outputNames,
        placement: placement(lines),
        warnings: lines.filter((l) => /\[W:|warn/i.test(l)).slice(0, 20),
      };
    }),

  // Runs a session on [{name, dtype, dims, b64}] and returns every output the same way.
  run: (key, feeds) =>
    guarded(async () => {
      const entry = sessions.get(key);
      if (!entry) throw new Error("no session " + key);
      const { ort, session } = entry;
      const tensors = {};
      for (const f of feeds) {
        const Ctor = ARRAYS[f.dtype];
        if (!Ctor) throw new Error("input " + f.name + ": unsupported dtype " + f.dtype);
        const bytes = fromB64(f.b64);
        tensors[f.name] = new ort.Tensor(f.dtype, new Ctor(bytes.buffer), f.dims);
      }
      const t0 = performance.now();
      const out = await session.run(tensors);
      const ms = performance.now() - t0;
      const outputs = {};
      for (const name of session.outputNames) {
        const v = out[name];
        const data = v.location && v.location !== "cpu" ? await v.getData(true) : v.data;
        if (!ARRAYS[v.type]) throw new Error("output " + name + ": unsupported dtype " + v.type);
        outputs[name] = {
          dtype: v.type,
          dims: Array.from(v.dims),
          b64: toB64(new Uint8Array(data.buffer, data.byteOffset, data.byteLength)),
        };
      }
      return { outputs, ms };
    }),

  // Drops a session.
  release: (key) =>
    guarded(async () => {
      const entry = sessions.get(key);
      sessions.delete(key);
      if (entry) await entry.session.release();
      return {};
    }),
};
window.ipfsAccelReady = true;
