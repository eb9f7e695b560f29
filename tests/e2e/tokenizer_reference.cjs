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
  const lengths = [];
  const tokens = [];
  const docIndices = [0];
  for (const line of fs.readFileSync(jsonl, "utf8").split("\n")) {
    if (!line.trim()) continue;
    const ids = encode(JSON.parse(line).text);
    if (ids.length) {
      ids.push(EOD);
      lengths.push(ids.length);
      for (const t of ids) tokens.push(t);
    }
    docIndices.push(lengths.length);
  }
  // .idx: magic, u64 version 1, u8 dtype 8 (u16), u64 S, u64 D+1, i32[S], i64[S] byte offsets, i64[D+1]
  const S = lengths.length, D1 = docIndices.length;
  const idx = Buffer.alloc(9 + 8 + 1 + 8 + 8 + 4 * S + 8 * S + 8 * D1);
  let o = 0;
  o += idx.write("MMIDIDX\0\0", o, "latin1");
  idx.writeBigUInt64LE(1n, o); o += 8;
  idx.writeUInt8(8, o); o += 1;
  idx.writeBigUInt64LE(BigInt(S), o); o += 8;
  idx.writeBigUInt64LE(BigInt(D1), o); o += 8;
  for (const n of lengths) { idx.writeInt32LE(n, o); o += 4; }
  let offset = 0n;
  for (const n of lengths) { idx.writeBigInt64LE(offset, o); o += 8; offset += BigInt(2 * n); }
  for (const d of docIndices) { idx.writeBigInt64LE(BigInt(d), o); o += 8; }
  const bin = Buffer.from(Uint16Array.from(tokens).buffer);
  const compare = (name, want) => {
    const got = fs.readFileSync(name);
    if (got.equals(want)) return;
    let i = 0;
    while (i < got.length && i < want.length && got[i] === want[i]) ++i;
    fail(`${name}: differs from the reference at byte ${i} (size ${got.length}, reference ${want.length})`);
  };
  compare(prefix + ".bin", bin);
  compare(prefix + ".idx", idx);
  process.stdout.write(`${D1 - 1} documents, ${tokens.length} tokens: identical\n`);
} else {
  fail("unknown mode '" + mode + "' (vectors, text, dataset)");
}
