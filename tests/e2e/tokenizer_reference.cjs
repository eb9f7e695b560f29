// The reference side of test_tokenizer_reference.sh: OpenAI's tiktoken (WASM build of its Rust
// encoder, npm tiktoken@1.0.22) encoding GPT-2 ("gpt2" = r50k_base), special tokens as plain text.
//   node tokenizer_reference.cjs NPM_DIR vectors FILE.jsonl   one line of ids per JSON string
//   node tokenizer_reference.cjs NPM_DIR text FILE            ids of the whole file, one line
//   node tokenizer_reference.cjs NPM_DIR dataset F.jsonl P    builds Megatron's P.bin/P.idx for
//        `preprocess --json-keys text --append-eod` from the spec and compares them byte for byte
// gpt-tokenizer@4.0.0 (pure JS) is run beside it on the vectors; it treats U+FEFF as white space
// and U+0085 as not (JavaScript's \s), tiktoken the other way round (Unicode White_Space), so a
// disagreement between the two is reported on stderr but only tiktoken is the reference.
"use strict";
const fs = require("fs");
const path = require("path");
const { expectIndexedDataset } = require("./indexed_dataset_reference.cjs");
const [npmDir, mode, ...args] = process.argv.slice(2);
const mod = (name) => require(path.join(path.resolve(npmDir), "node_modules", name));
const enc = mod("tiktoken").get_encoding("gpt2");
const encode = (s) => Array.from(enc.encode(s, [], []));  // no special tokens: "<|endoftext|>" is text
const EOD = 50256;

function fail(msg) {
  process.stderr.write("tokenizer_reference: " + msg + "\n");
  process.exit(1);
}

if (mode === "vectors") {
  const gt = mod("gpt-tokenizer/cjs/encoding/r50k_base.js");
  const out = [];
  fs.readFileSync(args[0], "utf8").split("\n").filter((l) => l.length).forEach((line, i) => {
    const s = JSON.parse(line);
    const ids = encode(s);
    const other = gt.encode(s, { disallowedSpecial: new Set() });
    if (other.join(" ") !== ids.join(" "))
      process.stderr.write(`note: vector ${i + 1} ${line}: gpt-tokenizer differs from tiktoken\n`);
    out.push(ids.join(" "));
  });
  process.stdout.write(out.join("\n") + "\n");
} else if (mode === "text") {
  process.stdout.write(encode(fs.readFileSync(args[0], "utf8")).join(" ") + "\n");
} else if (mode === "dataset") {
  const [jsonl, prefix] = args;
  const docs = fs.readFileSync(jsonl, "utf8").split("\n").filter((l) => l.trim())
    .map((l) => encode(JSON.parse(l).text)).map((ids) => (ids.length ? [...ids, EOD] : ids));
  try {
    process.stdout.write(expectIndexedDataset(prefix, docs, "u16") + "\n");
  } catch (e) {
    fail(e.message);
  }
} else {
  fail("unknown mode '" + mode + "' (vectors, text, dataset)");
}
