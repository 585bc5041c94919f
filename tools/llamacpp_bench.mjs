// llama.cpp's CPU generation speed on a GGUF file, through node-llama-cpp's prebuilt binaries,
// measured as `ipfs-accelerate generate --metrics` measures ours: greedy, the prompt tokenized
// without special tokens, prompt tokens/s = prompt length / time to the first new token, decode
// tokens/s = (new tokens - 1) / time after the first, no stop at end-of-sequence.
//
//   mkdir -p /work/llamacpp && cd /work/llamacpp && npm install node-llama-cpp
//   NODE_LLAMA_CPP_DIR=/work/llamacpp node tools/llamacpp_bench.mjs MODEL.gguf \
//       [--threads 2] [--max-new-tokens 128] [--prompt "The capital of France is"]
//
// Prints one JSON line: prompt_tokens, new_tokens, prefill_tokens_per_s, decode_tokens_per_s,
// load_ms, text. node-llama-cpp's postinstall is not needed: `build: "never"` loads the
// prebuilt CPU binaries of its @node-llama-cpp/linux-x64 dependency (llama.cpp picks the
// widest kernel set of this CPU at run time).

import { pathToFileURL } from "node:url";
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
const prompt = option("--prompt", "The capital of France is");
const modelPath = args[0];
if (!modelPath) {
  console.error("usage: llamacpp_bench.mjs MODEL.gguf [--threads N] [--max-new-tokens N] [--prompt TEXT]");
  process.exit(2);
}

// node-llama-cpp from $NODE_LLAMA_CPP_DIR/node_modules (the script lives outside that folder).
const dir = process.env.NODE_LLAMA_CPP_DIR ?? process.cwd();
const entry = path.join(dir, "node_modules", "node-llama-cpp", "dist", "index.js");
const { getLlama, LlamaLogLevel } = await import(pathToFileURL(entry).href);

const llama = await getLlama({
  gpu: false,
  build: "never",
  maxThreads: threads,
  logLevel: LlamaLogLevel.error,
});
const loadStart = performance.now();
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({
  contextSize: 512,
  batchSize: 512,
  sequences: 1,
  threads: { ideal: threads, min: threads },
});
const loadMs = performance.now() - loadStart;
const sequence = context.getSequence();
const tokens = model.tokenize(prompt, false);

const out = [];
const start = performance.now();
let first = null;
for await (const token of sequence.evaluate(tokens, { temperature: 0 })) {
  if (first === null) first = performance.now();
  out.push(token);
  if (out.length >= maxNewTokens) break;
}
const end = performance.now();
const seconds = (ms) => Math.max(ms, 1e-6) / 1000;
console.log(
  JSON.stringify({
    engine: "llama.cpp",
    threads,
    prompt_tokens: tokens.length,
    new_tokens: out.length,
    prefill_tokens_per_s: tokens.length / seconds(first - start),
    decode_tokens_per_s: (out.length - 1) / seconds(end - first),
    load_ms: loadMs,
    text: model.detokenize(out),
  }),
);
await context.dispose();
await model.dispose();
await llama.dispose();
