// The reference side of test_tiktoken_tokenizer.sh: Megatron's TikTokenizer computed with OpenAI's
// tiktoken (npm tiktoken@1.0.22: its Rust encoder in WASM), given the same ranks and pattern.
//   node tiktoken_reference.cjs NPM_DIR vocab OUT.json
//        writes a Megatron TikTokenizer vocabulary (a JSON list of {rank, token_bytes, token_str})
//        from cl100k_base's ranks: the 256 single bytes first, in byte order (Megatron requires it),
//        then cl100k's longer tokens in cl100k's rank order.
//   node tiktoken_reference.cjs NPM_DIR ids VOCAB.json PATTERN S V SPECIALS MODE FILE [PREFIX]
//        PATTERN v1|v2 (Megatron's), S special ids, V the vocabulary size (the first V - S ranks),
//        SPECIALS the special tokens (space-separated; "" for <unk> <s> </s>).
//        MODE vectors: one line of ids per JSON string line; text: the whole file's ids on one line;
//        dataset: Megatron's PREFIX.bin/.idx for the "text" of every line with the end of document
//        (</s>) appended, compared byte for byte.
"use strict";
const fs = require("fs");
const path = require("path");
const { expectIndexedDataset } = require("./indexed_dataset_reference.cjs");
const [npmDir, cmd, ...args] = process.argv.slice(2);
const mod = (name) => require(path.join(path.resolve(npmDir), "node_modules", name));

function fail(msg) {
  process.stderr.write("tiktoken_reference: " + msg + "\n");
  process.exit(1);
}

// Megatron's PATTERN_TIKTOKEN and PATTERN_TIKTOKEN_V2.
const PATTERNS = {
  v1: "[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
  v2: "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|" +
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|" +
      " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

if (cmd === "vocab") {
  const cl100k = mod("tiktoken/encoders/cl100k_base.json");
  const longer = [];
  for (const line of cl100k.bpe_ranks.split("\n")) {
    const parts = line.split(" ");
    if (parts.length < 2) continue;
    for (const b64 of parts.slice(2)) if (Buffer.from(b64, "base64").length > 1) longer.push(b64);
  }
  const b64s = [...Array.from({ length: 256 }, (_, b) => Buffer.from([b]).toString("base64")), ...longer];
  const vocab = b64s.map((b64, rank) => ({ rank, token_bytes: b64, token_str: Buffer.from(b64, "base64").toString("utf8") }));
  fs.writeFileSync(args[0], JSON.stringify(vocab));
  process.exit(0);
}
if (cmd !== "ids") fail("unknown command '" + cmd + "' (vocab, ids)");

const [vocabFile, pattern, sArg, vArg, specialsArg, mode, file, prefix] = args;
const S = Number(sArg), V = Number(vArg);
const specials = specialsArg.trim() ? specialsArg.trim().split(/\s+/) : ["<unk>", "<s>", "</s>"];
const eod = specials.indexOf("</s>");
const vocab = JSON.parse(fs.readFileSync(vocabFile, "utf8")).slice(0, V - S);
const { Tiktoken } = mod("tiktoken");
const enc = new Tiktoken("! 0 " + vocab.map((e) => e.token_bytes).join(" "), {}, PATTERNS[pattern]);
const tokenize = (s) => Array.from(enc.encode_ordinary(s), (r) => r + S);

if (mode === "vectors") {
  const out = fs.readFileSync(file, "utf8").split("\n").filter((l) => l.length).map((l) => tokenize(JSON.parse(l)).join(" "));
  process.stdout.write(out.join("\n") + "\n");
} else if (mode === "text") {
  process.stdout.write(tokenize(fs.readFileSync(file, "utf8")).join(" ") + "\n");
} else if (mode === "dataset") {
  const docs = fs.readFileSync(file, "utf8").split("\n").filter((l) => l.trim())
    .map((l) => tokenize(JSON.parse(l).text)).map((ids) => (ids.length ? [...ids, eod] : ids));
  try {
    process.stdout.write(expectIndexedDataset(prefix, docs, V < 65500 ? "u16" : "i32") + "\n");
  } catch (e) {
    fail(e.message);
  }
} else {
  fail("unknown mode '" + mode + "' (vectors, text, dataset)");
}
enc.free();
