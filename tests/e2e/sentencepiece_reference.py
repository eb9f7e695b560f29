#!/usr/bin/python3
"""Megatron's SentencePiece tokenizers in Python, the reference of test_sentencepiece_tokenizer.sh.

Written from Megatron-LM's tokenizer classes (SentencePieceTokenizer, GPTSentencePieceTokenizer,
Llama2Tokenizer) over Google's `sentencepiece` Python module (Debian's python3-sentencepiece), and
Megatron's indexed dataset (.bin/.idx, version 1) from its spec.

usage: sentencepiece_reference.py TYPE MODEL EXTRA_IDS MODE ARGS...
  vectors F.jsonl      one JSON string per line -> one line of ids per string
  text F               the whole file as one text -> its ids on one line
  decode F             one line of white-space separated ids per text -> each decoded text as a
                       JSON string on its own line
  dataset F.jsonl P    Megatron's P.bin/P.idx for the "text" of every line with --append-eod,
                       compared byte for byte with the files there; prints what matched
Exits 1 naming the first difference.
"""
import json
import struct
import sys

import sentencepiece


class MegatronSentencePiece:
    """Megatron's three SentencePiece tokenizers: tokenize, detokenize, eod, vocab_size."""

    def __init__(self, kind, model_file, vocab_extra_ids):
        self.kind = kind
        self.sp = sentencepiece.SentencePieceProcessor(model_file=model_file)
        self.vocab = {self.sp.id_to_piece(i): i for i in range(len(self.sp))}
        self.special = {}  # token -> id, in the order added
        self.inv_special = {}
        if kind == "SentencePieceTokenizer":
            def add(token):
                if token not in self.vocab:
                    self.vocab[token] = len(self.vocab)
                self.special[token] = self.vocab[token]
                self.inv_special[self.vocab[token]] = token

            def piece_or(i, fallback):
                try:
                    return self.sp.id_to_piece(i)
                except IndexError:
                    return fallback

            for t in ("<CLS>", "<SEP>", "<EOD>", "<MASK>"):
                add(t)
            add(piece_or(self.sp.pad_id(), "<PAD>"))
            add(piece_or(self.sp.bos_id(), "<BOS>"))
            add(piece_or(self.sp.eos_id(), "<EOS>"))
            for i in range(vocab_extra_ids):
                add("<extra_id_{}>".format(i))
            self.eod = self.vocab["<EOD>"]
        else:
            self.eod = self.sp.eos_id()
        self.vocab_size = len(self.vocab) if kind != "Llama2Tokenizer" else self.sp.vocab_size()

    def tokenize(self, text):
        if self.kind == "Llama2Tokenizer":
            return [self.sp.bos_id()] + self.sp.encode(text)
        if self.kind == "GPTSentencePieceTokenizer":
            return self.sp.encode_as_ids(text)
        ids, idx = [], 0
        while True:
            indices = {}
            for token in self.special:
                try:
                    indices[token] = text[idx:].index(token)
                except ValueError:
                    continue
            if not indices:
                break
            token = min(indices, key=indices.get)
            at = idx + indices[token]
            ids.extend(self.sp.encode_as_ids(text[idx:at]))
            ids.append(self.special[token])
            idx = at + len(token)
        ids.extend(self.sp.encode_as_ids(text[idx:]))
        return ids

    def detokenize(self, ids):
        if self.kind != "SentencePieceTokenizer":
            return self.sp.decode_ids(ids)
        text, last = "", 0
        for i, id_ in enumerate(ids):
            if id_ in self.inv_special:
                text += self.sp.decode_ids(ids[last:i]) + " " + self.inv_special[id_] + " "
                last = i + 1
        return text + self.sp.decode_ids(ids[last:])


def fail(msg):
    print("sentencepiece_reference: " + msg, file=sys.stderr)
    sys.exit(1)


def expect_dataset(prefix, docs, vocab_size):
    """Megatron's MMIDIDX files for `docs` (lists of ids; an empty list is a document without a
    sequence), compared with PREFIX.bin/.idx."""
    dtype, code = ("H", 8) if vocab_size < 65500 else ("i", 4)
    lengths = [len(d) for d in docs if d]
    bin_want = b"".join(struct.pack("<%d%s" % (len(d), dtype), *d) for d in docs if d)
    size = struct.calcsize(dtype)
    pointers, offset = [], 0
    for n in lengths:
        pointers.append(offset)
        offset += n * size
    doc_index, count = [0], 0
    for d in docs:
        count += 1 if d else 0
        doc_index.append(count)
    idx_want = (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code) +
                struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_index)) +
                struct.pack("<%di" % len(lengths), *lengths) + struct.pack("<%dq" % len(pointers), *pointers) +
                struct.pack("<%dq" % len(doc_index), *doc_index))
    for suffix, want in ((".bin", bin_want), (".idx", idx_want)):
        with open(prefix + suffix, "rb") as f:
            got = f.read()
        if got != want:
            at = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
            fail("%s%s differs from Megatron's at byte %d (%d bytes, want %d)" % (prefix, suffix, at, len(got), len(want)))
    return "%d documents, %d tokens: identical" % (len(docs), sum(lengths))


def main():
    if len(sys.argv) < 6:
        fail("usage: sentencepiece_reference.py TYPE MODEL EXTRA_IDS MODE ARGS...")
    kind, model, extra, mode, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
    tok = MegatronSentencePiece(kind, model, extra)
    out = sys.stdout
    if mode == "vectors":
        with open(args[0], encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    out.write(" ".join(map(str, tok.tokenize(json.loads(line)))) + "\n")
    elif mode == "text":
        with open(args[0], encoding="utf-8", newline="") as f:
            out.write(" ".join(map(str, tok.tokenize(f.read()))) + "\n")
    elif mode == "decode":
        with open(args[0]) as f:
            for line in f:
                out.write(json.dumps(tok.detokenize([int(w) for w in line.split()])) + "\n")
    elif mode == "dataset":
        docs = []
        with open(args[0], encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    ids = tok.tokenize(json.loads(line)["text"])
                    docs.append(ids + [tok.eod] if ids else ids)
        out.write(expect_dataset(args[1], docs, tok.vocab_size) + "\n")
    else:
        fail("unknown mode '%s' (vectors, text, decode, dataset)" % mode)


if __name__ == "__main__":
    main()
