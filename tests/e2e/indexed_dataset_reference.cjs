// Megatron's indexed dataset (.bin/.idx, version 1), built from the spec in JavaScript for the
// tokenizer reference scripts, and a byte-for-byte comparison with the files lattice wrote.
//   const { expectIndexedDataset } = require("./indexed_dataset_reference.cjs");
//   expectIndexedDataset(prefix, docs, dtype)   docs: one array of ids per document (an empty
//   array ends a document without a sequence); dtype: "u16" (code 8) or "i32" (code 4).
//   Returns "D documents, N tokens: identical"; throws naming the file and the first differing byte.
"use strict";
const fs = require("fs");

function expectIndexedDataset(prefix, docs, dtype) {
  const code = { u16: 8, i32: 4 }[dtype];
  const width = { u16: 2, i32: 4 }[dtype];
  if (!code) throw new Error("unknown dtype " + dtype);
  const lengths = [];
  const tokens = [];
  const docIndices = [0];
  for (const ids of docs) {
    if (ids.length) {
      lengths.push(ids.length);
      for (const t of ids) tokens.push(t);
    }
    docIndices.push(lengths.length);
  }
  // .idx: magic, u64 version 1, u8 dtype, u64 S, u64 D+1, i32[S], i64[S] byte offsets, i64[D+1]
  const S = lengths.length, D1 = docIndices.length;
  const idx = Buffer.alloc(9 + 8 + 1 + 8 + 8 + 4 * S + 8 * S + 8 * D1);
  let o = 0;
  o += idx.write("MMIDIDX\0\0", o, "latin1");
  idx.writeBigUInt64LE(1n, o); o += 8;
  idx.writeUInt8(code, o); o += 1;
  idx.writeBigUInt64LE(BigInt(S), o); o += 8;
  idx.writeBigUInt64LE(BigInt(D1), o); o += 8;
  for (const n of lengths) { idx.writeInt32LE(n, o); o += 4; }
  let offset = 0n;
  for (const n of lengths) { idx.writeBigInt64LE(offset, o); o += 8; offset += BigInt(width * n); }
  for (const d of docIndices) { idx.writeBigInt64LE(BigInt(d), o); o += 8; }
  const bin = Buffer.from((dtype === "u16" ? Uint16Array : Int32Array).from(tokens).buffer);
  const compare = (name, want) => {
    const got = fs.readFileSync(name);
    if (got.equals(want)) return;
    let i = 0;
    while (i < got.length && i < want.length && got[i] === want[i]) ++i;
    throw new Error(`${name}: differs from the reference at byte ${i} (size ${got.length}, reference ${want.length})`);
  };
  compare(prefix + ".bin", bin);
  compare(prefix + ".idx", idx);
  return `${D1 - 1} documents, ${tokens.length} tokens: identical`;
}

module.exports = { expectIndexedDataset };
