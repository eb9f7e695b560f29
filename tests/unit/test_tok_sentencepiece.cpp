// Megatron's SentencePiece tokenizers (SentencePieceTokenizer, GPTSentencePieceTokenizer,
// Llama2Tokenizer) on models trained here with SentencePiece's own trainer: what each adds around
// the library (special tokens and their ids, the earliest-first search and its tie rule, bos,
// eos as the end of document, decoding), and the one-line errors. The ids of the library itself
// are its own; tests/e2e/test_sentencepiece_tokenizer.sh compares with Megatron's Python classes.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"
#include "test_util.h"

#include <nlohmann/json.hpp>

using namespace lattice;
using lattice::test_util::error_of;
using lattice::test_util::temp_dir;

namespace {

// A small English corpus: enough distinct words for a few hundred pieces.
std::string corpus_file(const std::string& dir) {
  const std::string path = dir + "/corpus.txt";
  std::ofstream f(path);
  const char* words[] = {"the", "light", "was", "good", "and", "God", "divided", "darkness", "from", "waters",
                         "heaven", "earth", "morning", "evening", "day", "night", "firmament", "seed", "tree",
                         "fruit", "beast", "creeping", "thing", "after", "his", "kind", "image", "likeness", "42",
                         "1999", "said", "let", "there", "be", "in", "it", "upon", "face", "deep", "spirit"};
  const int n = int(sizeof(words) / sizeof(words[0]));
  for (int line = 0; line < 400; ++line) {
    for (int w = 0; w < 12; ++w) f << (w ? " " : "") << words[(line * 7 + w * 13 + w * w) % n];
    f << ".\n";
  }
  return path;
}

// Trains a model with SentencePiece's trainer; `flags` are spm_train's. Returns the model file.
// Each model in its own folder of one folder per process (temp_dir() empties the test's folder).
std::string train_model(const std::string& name, const std::string& flags) {
  static const std::string root = [] {
    const auto d = std::filesystem::temp_directory_path() / ("lattice_spm_models_" + std::to_string(getpid()));
    test_util::TempDirs::add(d.string());
    return d.string();
  }();
  const std::string dir = root + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string prefix = dir + "/" + name;
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + corpus_file(dir) + " --model_prefix=" + prefix +
      " --vocab_size=300 --num_threads=1 --minloglevel=2 --hard_vocab_limit=false " + flags);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return prefix + ".model";
}

// Llama 2's settings: BPE, byte fallback, digits split, no normalization.
std::string llama2_model() {
  static const std::string m = train_model("llama2", "--model_type=bpe --byte_fallback=true --split_digits=true "
                                                     "--normalization_rule_name=identity --remove_extra_whitespaces=false");
  return m;
}

// The library's own ids for `text`.
std::vector<int32_t> library_ids(const std::string& model, const std::string& text) {
  sentencepiece::SentencePieceProcessor sp;
  EXPECT_TRUE(sp.Load(model).ok());
  std::vector<int> ids;
  EXPECT_TRUE(sp.Encode(text, &ids).ok());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

int piece_count(const std::string& model) {
  sentencepiece::SentencePieceProcessor sp;
  EXPECT_TRUE(sp.Load(model).ok());
  return sp.GetPieceSize();
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TokenizerSpec spec(const std::string& type, const std::string& model, int64_t extra_ids = 0) {
  return {type, "", "", model, 0, extra_ids};
}

}  // namespace

TEST(TokSentencePiece, Llama2PutsBosFirstAndEndsDocumentsWithEos) {
  const std::string m = llama2_model();
  const auto tok = make_tokenizer(spec("Llama2Tokenizer", m));
  EXPECT_STREQ(tok->name(), "Llama2Tokenizer");
  EXPECT_EQ(tok->vocab_size(), piece_count(m));
  EXPECT_EQ(tok->eod(), 2);  // spm_train's eos_id
  const std::string text = "In the beginning God created 1999 heavens and the earth. \xE6\x97\xA5\xE6\x9C\xAC";
  EXPECT_EQ(tok->encode(text), cat({{1}, library_ids(m, text)}));
  EXPECT_EQ(tok->encode(""), std::vector<int32_t>{1});
  // Digits are split and unseen characters fall back to bytes, so decoding gives the text back.
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
  EXPECT_EQ(tok->decode({1, 2}), "");  // bos and eos are control pieces
}

// A chat template's text (Llama 2's, Mistral's: "<s>[INST] ... [/INST]"): the bos and eos pieces' texts
// are those ids, the text between them the library's, with no bos added.
TEST(TokSentencePiece, ChatTextFindsTheBosAndEosPieces) {
  const std::string m = llama2_model();
  for (const char* type : {"Llama2Tokenizer", "GPTSentencePieceTokenizer"}) {
    const auto tok = make_tokenizer(spec(type, m));
    EXPECT_EQ(tok->encode_without_specials("<s>[INST] In the beginning [/INST] God</s><s>[INST] day"),
              cat({{1}, library_ids(m, "[INST] In the beginning [/INST] God"), {2}, {1}, library_ids(m, "[INST] day")}))
        << type;
    EXPECT_EQ(tok->encode_without_specials("the earth"), library_ids(m, "the earth")) << type;
    EXPECT_EQ(tok->encode_without_specials(""), std::vector<int32_t>{}) << type;
  }
  const auto megatron = make_tokenizer(spec("SentencePieceTokenizer", m));
  EXPECT_EQ(megatron->encode_without_specials("a <EOD> b"), megatron->encode("a <EOD> b"));
}

// A HuggingFace folder's added tokens beside tokenizer.model (Phi-3's: its chat markers after Llama 2's
// pieces, rstrip true, eos_token <|endoftext|>): the vocabulary grows by them, a chat template's text finds
// them (and the whitespace their rstrip or lstrip takes), decoding writes them, the end of document is
// eos_token's; preprocess's encode stays the model's alone. A gap in their ids is refused naming the file.
TEST(TokSentencePiece, HuggingFaceAddedTokensBesideTheModel) {
  const std::string m = llama2_model();
  const int pieces = piece_count(m);
  const std::string dir = temp_dir() + "/phi3";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(m, dir + "/tokenizer.model");
  auto config = [&](const std::vector<std::tuple<int, std::string, bool, bool>>& added, const std::string& eos) {
    nlohmann::json d = nlohmann::json::object();
    for (const auto& [id, content, lstrip, rstrip] : added)
      d[std::to_string(id)] = {{"content", content}, {"lstrip", lstrip}, {"rstrip", rstrip}, {"special", true}};
    std::ofstream(dir + "/tokenizer_config.json") << nlohmann::json{{"added_tokens_decoder", d}, {"eos_token", eos}}.dump();
  };
  config({{0, "<unk>", false, false}, {1, "<s>", false, false}, {2, "</s>", false, false},
          {pieces, "<|endoftext|>", false, false}, {pieces + 1, "<|assistant|>", false, true},
          {pieces + 2, "<|end|>", false, true}, {pieces + 3, "<|user|>", false, true}, {pieces + 4, "<x>", true, false}},
         "<|endoftext|>");
  for (const char* type : {"Llama2Tokenizer", "GPTSentencePieceTokenizer"}) {
    SCOPED_TRACE(type);
    const auto tok = make_tokenizer(spec(type, dir));
    EXPECT_EQ(tok->vocab_size(), pieces + 5);
    EXPECT_EQ(tok->eod(), pieces);
    const std::vector<int32_t> ids = tok->encode_without_specials("<s><|user|>\nthe light<|end|>\n<|assistant|>\n");
    EXPECT_EQ(ids, cat({{1, pieces + 3}, library_ids(m, "the light"), {pieces + 2, pieces + 1}}));
    EXPECT_EQ(tok->encode_without_specials("the day  <x>\n"), cat({library_ids(m, "the day"), {pieces + 4}, library_ids(m, "\n")}));
    EXPECT_EQ(tok->decode(ids), "<|user|>the light<|end|><|assistant|>");
    EXPECT_EQ(tok->encode("<|end|>"), std::string(type) == "Llama2Tokenizer" ? cat({{1}, library_ids(m, "<|end|>")})
                                                                             : library_ids(m, "<|end|>"));
  }
  // Without an added eos_token the model's eos ends documents.
  config({{pieces, "<|end|>", false, false}}, "</s>");
  EXPECT_EQ(make_tokenizer(spec("Llama2Tokenizer", dir))->eod(), 2);
  config({{pieces + 1, "<|end|>", false, false}}, "</s>");
  const std::string gap = error_of([&] { make_tokenizer(spec("Llama2Tokenizer", dir)); });
  EXPECT_NE(gap.find("tokenizer_config.json: added token " + std::to_string(pieces + 1) + " ('<|end|>') leaves a gap"),
            std::string::npos)
      << gap;
}

TEST(TokSentencePiece, GptSentencePieceIsTheLibraryAlone) {
  const std::string m = llama2_model();
  const auto tok = make_tokenizer(spec("GPTSentencePieceTokenizer", m));
  EXPECT_STREQ(tok->name(), "GPTSentencePieceTokenizer");
  EXPECT_EQ(tok->vocab_size(), piece_count(m));
  EXPECT_EQ(tok->eod(), 2);
  const std::string text = "and the evening and the morning were the first day <EOD> </s>";
  EXPECT_EQ(tok->encode(text), library_ids(m, text));
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
}

TEST(TokSentencePiece, MegatronSpecialTokensFollowThePieces) {
  const std::string m = llama2_model();  // unk 0, bos <s> 1, eos </s> 2, no pad
  const int n = piece_count(m);
  const auto tok = make_tokenizer(spec("SentencePieceTokenizer", m, 3));
  EXPECT_STREQ(tok->name(), "SentencePieceTokenizer");
  // <CLS> n, <SEP> n+1, <EOD> n+2, <MASK> n+3, <PAD> n+4 (the model has no pad piece), <s> and
  // </s> keep their ids, <extra_id_0..2> n+5..n+7.
  EXPECT_EQ(tok->vocab_size(), n + 8);
  EXPECT_EQ(tok->eod(), n + 2);
  auto lib = [&](const std::string& t) { return library_ids(m, t); };
  EXPECT_EQ(tok->encode("<CLS><SEP><EOD><MASK><PAD><s></s><extra_id_0><extra_id_2>"),
            (std::vector<int32_t>{n, n + 1, n + 2, n + 3, n + 4, 1, 2, n + 5, n + 7}));
  // The earliest token first, whatever the order they were added in; the text between them to
  // the model.
  EXPECT_EQ(tok->encode("the light<MASK>was good<CLS> and<EOD>"),
            cat({lib("the light"), {n + 3}, lib("was good"), {n}, lib(" and"), {n + 2}}));
  EXPECT_EQ(tok->encode("<EOD"), lib("<EOD"));
  EXPECT_EQ(tok->encode("<extra_id_3>"), lib("<extra_id_3>"));  // only 3 extra ids
  // Decoding writes each special token as " TOKEN ".
  EXPECT_EQ(tok->decode(tok->encode("the light<EOD>was good")), "the light <EOD> was good");
  EXPECT_EQ(tok->decode({n + 2, 2}), " <EOD>  </s> ");
  EXPECT_NE(error_of([&] { tok->decode({n + 8}); }).find("id " + std::to_string(n + 8)), std::string::npos);
}

TEST(TokSentencePiece, ModelPiecesServeAsPadBosAndEos) {
  // T5's ids: pad 0, eos 1, unk 2, no bos; unigram with the default NFKC normalization.
  const std::string m = train_model("t5", "--model_type=unigram --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1");
  const int n = piece_count(m);
  const auto tok = make_tokenizer(spec("SentencePieceTokenizer", m));
  // <CLS> <SEP> <EOD> <MASK> new, <pad> is piece 0, <BOS> new, </s> is piece 1.
  EXPECT_EQ(tok->vocab_size(), n + 5);
  EXPECT_EQ(tok->eod(), n + 2);
  EXPECT_EQ(tok->encode("<pad><BOS></s>"), (std::vector<int32_t>{0, n + 4, 1}));
  const std::string text = "\xEF\xBC\xA7od said";  // a full-width G: NFKC makes it G
  EXPECT_EQ(tok->encode(text), library_ids(m, text));
  EXPECT_EQ(tok->encode(text), library_ids(m, "God said"));
  EXPECT_EQ(make_tokenizer(spec("GPTSentencePieceTokenizer", m))->eod(), 1);
}

TEST(TokSentencePiece, AmongTokensAtOnePlaceTheFirstAddedWins) {
  // The pad piece "<CLS>x" starts with <CLS>: at one place Megatron takes the token added first
  // (<CLS>), not the longest.
  const std::string m = train_model("tie", "--model_type=bpe --pad_id=3 --pad_piece=<CLS>x");
  const int n = piece_count(m);
  const auto tok = make_tokenizer(spec("SentencePieceTokenizer", m));
  EXPECT_EQ(tok->vocab_size(), n + 4);  // <CLS> <SEP> <EOD> <MASK>; the pad piece is the model's
  EXPECT_EQ(tok->encode("<CLS>x"), cat({{n}, library_ids(m, "x")}));
  EXPECT_EQ(tok->encode("a<CLS>x"), cat({library_ids(m, "a"), {n}, library_ids(m, "x")}));
}

TEST(TokSentencePiece, ModelFolderAndThreads) {
  const std::string m = llama2_model();
  const std::string dir = temp_dir();
  std::filesystem::copy_file(m, dir + "/tokenizer.model");
  const auto tok = make_tokenizer(spec("Llama2Tokenizer", dir));
  const std::string text = "the spirit of God moved upon the face of the waters";
  const std::vector<int32_t> want = make_tokenizer(spec("Llama2Tokenizer", m))->encode(text);
  EXPECT_EQ(tok->encode(text), want);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) got[t] = tok->encode(text);
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST(TokSentencePiece, ErrorsNameTheFlagAndTheFile) {
  const std::string dir = temp_dir();
  auto expect = [](const std::string& msg, std::initializer_list<const char*> parts) {
    EXPECT_FALSE(msg.empty());
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  };
  expect(error_of([&] { make_tokenizer(spec("Llama2Tokenizer", dir + "/missing.model")); }),
         {"--tokenizer-model", "missing.model", "cannot open"});
  expect(error_of([&] { make_tokenizer(spec("Llama2Tokenizer", dir)); }), {"--tokenizer-model", "tokenizer.model"});
  {
    std::ofstream(dir + "/text.model") << "this is not a protobuf model\n";
  }
  expect(error_of([&] { make_tokenizer(spec("SentencePieceTokenizer", dir + "/text.model")); }),
         {"--tokenizer-model", "text.model", "not a SentencePiece model"});
  const std::string no_eos = train_model("noeos", "--model_type=bpe --eos_id=-1");
  expect(error_of([&] { make_tokenizer(spec("GPTSentencePieceTokenizer", no_eos)); }),
         {"--tokenizer-model", "noeos.model", "no eos piece"});
  const std::string no_bos = train_model("nobos", "--model_type=bpe --bos_id=-1");
  expect(error_of([&] { make_tokenizer(spec("Llama2Tokenizer", no_bos)); }), {"nobos.model", "no bos piece"});
  EXPECT_EQ(make_tokenizer(spec("SentencePieceTokenizer", no_eos))->vocab_size(), piece_count(no_eos) + 6);  // <PAD> and <EOS> new, <s> the model's
  expect(error_of([&] { make_tokenizer(spec("Llama2Tokenizer", llama2_model(), 2)); }),
         {"--vocab-extra-ids", "Llama2Tokenizer", "SentencePieceTokenizer"});
  expect(error_of([&] { make_tokenizer(spec("SentencePieceTokenizer", "")); }), {"--tokenizer-model is required"});
  expect(error_of([&] { make_tokenizer(spec("ByteTokenizer", llama2_model())); }), {"--tokenizer-model", "ByteTokenizer"});
  expect(error_of([&] { make_tokenizer({"GPT2BPETokenizer", "v.json", "m.txt", "", 0, 1}); }), {"--vocab-extra-ids"});
}
