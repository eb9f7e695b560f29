// The reference side of test_hf_tokenizer.sh: HuggingFace's tokenizer.json run by
// @huggingface/tokenizers@0.2.0 (npm, JavaScript), beside OpenAI's tiktoken (the folders are
// make_hf_tokenizer.cjs's: cl100k_base with <|begin_of_text|> = 100277 first, or GPT-2's; the
// Qwen2-style folder against HuggingFace's implementation alone).
//   node hf_tokenizer_reference.cjs NPM_DIR TOKDIR vectors FILE.jsonl   one line of ids per JSON string
//   node hf_tokenizer_reference.cjs NPM_DIR TOKDIR text FILE            ids of the whole file, one line
//   node hf_tokenizer_reference.cjs NPM_DIR TOKDIR dataset F.jsonl P    Megatron's P.bin/P.idx for
//        `preprocess --json-keys text --append-eod` (int32 ids), compared byte for byte
// The two must agree, with one known exception: JavaScript's \s counts U+FEFF as white space and
// not U+0085, while Oniguruma's (HuggingFace's Rust tokenizers) and tiktoken's do the opposite;
// the JavaScript port keeps JavaScript's \s in ByteLevel's own regex. On a text holding either
// character tiktoken's ids are the reference (a note on stderr says so); any other disagreement
// fails.
"use strict";
const fs = require("fs");
const path = require("path");
const { expectIndexedDataset } = require("./indexed_dataset_reference.cjs");
const [npmDir, tokDir, mode, ...args] = process.argv.slice(2);
const mod = (name) => require(path.join(path.resolve(npmDir), "node_modules", name));
const { Tokenizer } = mod("@huggingface/tokenizers");
const readJson = (name) => JSON.parse(fs.readFileSync(path.join(tokDir, name), "utf8"));
const config = readJson("tokenizer_config.json");
const tok = new Tokenizer(readJson("tokenizer.json"), config);
const encode = (s) => Array.from(tok.encode(s).ids);
const eod = tok.encode(config.eos_token).ids.slice(-1)[0];
// tiktoken encodes the Llama 3-style and GPT-2 folders too; the Qwen2-style one (a normalizer, its
// own regex) has HuggingFace's implementation alone as its reference.
const normalized = readJson("tokenizer.json").normalizer !== null;
const cl100k = readJson("tokenizer.json").added_tokens.some((t) => t.content === "<|begin_of_text|>");
const tiktoken = mod("tiktoken").get_encoding(cl100k ? "cl100k_base" : "gpt2");
const tiktokenEncode = (s) => [...(cl100k ? [100277] : []), ...Array.from(tiktoken.encode(s, "all"))];

function fail(msg) {
  process.stderr.write("hf_tokenizer_reference: " + msg + "\n");
  process.exit(1);
}

// The reference ids of `s` (what = where it comes from, for the messages).
function reference(s, what) {
  const hf = encode(s);
  if (normalized) return hf;
  const tt = tiktokenEncode(s);
  if (hf.join(" ") === tt.join(" ")) return hf;
  if (!/[\u0085\ufeff]/.test(s)) fail(`${what}: @huggingface/tokenizers and tiktoken disagree`);
  process.stderr.write(`note: ${what}: tiktoken's ids (U+0085/U+FEFF: JavaScript's \\s differs from Oniguruma's)\n`);
  return tt;
}

if (mode === "vectors") {
  const out = [];
  fs.readFileSync(args[0], "utf8").split("\n").filter((l) => l.length).forEach((line, i) => {
    out.push(reference(JSON.parse(line), `vector ${i + 1} ${line}`).join(" "));
  });
  process.stdout.write(out.join("\n") + "\n");
} else if (mode === "text") {
  process.stdout.write(reference(fs.readFileSync(args[0], "utf8"), args[0]).join(" ") + "\n");
} else if (mode === "dataset") {
  const [jsonl, prefix] = args;
  const docs = fs.readFileSync(jsonl, "utf8").split("\n").filter((l) => l.trim())
    .map((l, i) => reference(JSON.parse(l).text, `${jsonl} line ${i + 1}`)).map((ids) => (ids.length ? [...ids, eod] : ids));
  try {
    process.stdout.write(expectIndexedDataset(prefix, docs, "i32") + "\n");
  } catch (e) {
    fail(e.message);
  }
} else {
  fail("unknown mode '" + mode + "' (vectors, text, dataset)");
}
