// llama.cpp's CPU generation speed on a GGUF file, through node-llama-cpp's prebuilt binaries:
// the peer of `ipfs-accelerate bench --peer llamacpp` (which runs this file with our prompt's
// token ids), measured as ours is: greedy, no stop at end-of-sequence, each timed iteration one
// whole generation from an empty context; time to first token = prompt evaluation + first token;
// decode = ms per new token after the first.
//
//   npm install --prefix target/peers/llamacpp node-llama-cpp     (cargo xtask fetch-peers --only llamacpp)
//   NODE_LLAMA_CPP_DIR=target/peers/llamacpp node tools/llamacpp_bench.mjs MODEL.gguf \
//       [--threads 2] [--max-new-tokens 128] [--prompt-ids 5,17,... | --prompt "text"] \
//       [--warmup 1] [--iters 3]
//
// Prints one JSON line: engine, version, dtype ("gguf"), status, threads, prompt_tokens,
// new_tokens, ttft_ms[] and decode_ms[] (one per timed iteration), load_ms, peak_rss_bytes, text.
// node-llama-cpp's postinstall is not needed: `build: "never"` loads the prebuilt CPU binaries
// of its @node-llama-cpp/linux-x64 dependency (llama.cpp picks the widest kernel set of this CPU
// at run time).

import { pathToFileURL } from "node:url";
import { readFileSync } from "node:fs";
import path from "node:path";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(name);
  if (i < 0) return fallback;
  const value = args[i + 1];
  args.splice(i, 2);
  return value;
};
const threads = Number(option("--threads", "2"));
const maxNewTokens = Number(option("--max-new-tokens", "128"));
const promptText = option("--prompt", "The capital of France is");
const promptIds = option("--prompt-ids", null);
const warmup = Number(option("--warmup", "1"));
const iters = Number(option("--iters", "3"));
const modelPath = args[0];
const fail = (status, reason) => {
  console.log(JSON.stringify({ engine: "llama.cpp", dtype: "gguf", status, reason }));
  process.exit(0);
};
if (!modelPath || !(maxNewTokens >= 2) || !(iters >= 1) || !(warmup >= 0)) {
  console.error(
    "usage: llamacpp_bench.mjs MODEL.gguf [--threads N] [--max-new-tokens N>=2] " +
      "[--prompt-ids A,B,... | --prompt TEXT] [--warmup N] [--iters N>=1]",
  );
  process.exit(2);
}

// node-llama-cpp from $NODE_LLAMA_CPP_DIR/node_modules (the script lives outside that folder).
const dir = process.env.NODE_LLAMA_CPP_DIR ?? process.cwd();
const pkgDir = path.join(dir, "node_modules", "node-llama-cpp");
let version = null;
try {
  version = JSON.parse(readFileSync(path.join(pkgDir, "package.json"), "utf8")).version;
} catch {
  fail("unavailable", `node-llama-cpp is not installed under ${dir}/node_modules`);
}
const { getLlama, LlamaLogLevel } = await import(pathToFileURL(path.join(pkgDir, "dist", "index.js")).href);

let llama, model, context;
try {
  llama = await getLlama({ gpu: false, build: "never", maxThreads: threads, logLevel: LlamaLogLevel.error });
} catch (e) {
  fail("unavailable", `node-llama-cpp has no prebuilt CPU binary for this machine: ${e}`);
}
const loadStart = performance.now();
try {
  model = await llama.loadModel({ modelPath, gpuLayers: 0 });
} catch (e) {
  fail("failed", `llama.cpp could not load ${modelPath}: ${e}`);
}
const tokens = promptIds ? promptIds.split(",").map(Number) : model.tokenize(promptText, false);
const contextSize = Math.max(512, tokens.length + maxNewTokens + 16);
context = await model.createContext({
  contextSize,
  batchSize: Math.max(512, tokens.length),
  sequences: 1,
  threads: { ideal: threads, min: threads },
});
const loadMs = performance.now() - loadStart;
const sequence = context.getSequence();

// One generation from an empty context: [ms to the first token, ms per token after it, tokens].
async function once() {
  await sequence.clearHistory();
  const out = [];
  const start = performance.now();
  let first = null;
  for await (const token of sequence.evaluate(tokens, { temperature: 0 })) {
    if (first === null) first = performance.now();
    out.push(token);
    if (out.length >= maxNewTokens) break;
  }
  const end = performance.now();
  return [first - start, (end - first) / (out.length - 1), out];
}

const ttft = [];
const decode = [];
let last = [];
for (let i = 0; i < warmup + iters; i++) {
  const [first, perToken, out] = await once();
  last = out;
  if (i >= warmup) {
    ttft.push(first);
    decode.push(perToken);
  }
}
console.log(
  JSON.stringify({
    engine: "llama.cpp",
    version: version ? `node-llama-cpp ${version}` : null,
    dtype: "gguf",
    status: "ok",
    threads,
    prompt_tokens: tokens.length,
    new_tokens: last.length,
    ttft_ms: ttft,
    decode_ms: decode,
    load_ms: loadMs,
    peak_rss_bytes: process.resourceUsage().maxRSS * 1024,
    text: model.detokenize(last),
  }),
);
await context.dispose();
await model.dispose();
await llama.dispose();
