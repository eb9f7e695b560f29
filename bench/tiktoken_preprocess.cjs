// The peer of `lattice preprocess` in bench/preprocess_bench.sh: tiktoken@1.0.22 (OpenAI's Rust
// encoder compiled to WASM) in node, over the same jsonl: stream the lines, JSON.parse, encode the
// "text" value, append the end-of-document id; tokens are counted, not written. One thread (node
// runs JavaScript on one). ENCODING: gpt2 (GPT2BPETokenizer's), or cl100k_base with special tokens
// recognised and a begin-of-text id counted first (the Llama 3-style HuggingFaceTokenizer of
// tests/e2e/make_hf_tokenizer.cjs).
//   node bench/tiktoken_preprocess.cjs NPM_DIR FILE.jsonl [ENCODING]
// prints: tiktoken: <documents> documents, <tokens> tokens, <MB> MB in <s> s (<MB/s> MB/s, peak RSS <MB> MB)
"use strict";
const fs = require("fs");
const path = require("path");
const readline = require("readline");
const [npmDir, input, encoding = "gpt2"] = process.argv.slice(2);
const { get_encoding } = require(path.join(path.resolve(npmDir), "node_modules", "tiktoken"));

(async () => {
  const t0 = process.hrtime.bigint();
  const enc = get_encoding(encoding);
  const cl100k = encoding === "cl100k_base";
  let docs = 0, tokens = 0, bytes = 0;
  const lines = readline.createInterface({ input: fs.createReadStream(input), crlfDelay: Infinity });
  for await (const line of lines) {
    bytes += Buffer.byteLength(line) + 1;
    if (!line.trim()) continue;
    const ids = cl100k ? enc.encode(JSON.parse(line).text, "all") : enc.encode(JSON.parse(line).text, [], []);
    tokens += cl100k ? ids.length + 2 : ids.length + (ids.length ? 1 : 0);
    ++docs;
  }
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  const mb = bytes / 1e6;
  const rss = process.resourceUsage().maxRSS / 1024;
  console.log(`tiktoken ${encoding}: ${docs} documents, ${tokens} tokens, ${mb.toFixed(2)} MB in ${s.toFixed(2)} s ` +
              `(${(mb / s).toFixed(2)} MB/s, peak RSS ${rss.toFixed(0)} MB)`);
})();
