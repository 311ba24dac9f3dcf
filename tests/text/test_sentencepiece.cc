#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "parallax/core.h"
#include "parallax/text.h"
#include "testing.h"

namespace fs = std::filesystem;
using px::testing::error_of;
using namespace std::string_literals;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("px_test_sp_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A small corpus in several scripts, repeated with variations so the trainer has statistics.
std::vector<std::string> corpus() {
  const std::vector<std::string> base = {
      "The quick brown fox jumps over the lazy dog.",
      "A dictionary lists the words of a language with their meanings.",
      "Der schnelle braune Fuchs springt über den faulen Hund.",
      "Быстрая коричневая лиса прыгает через ленивую собаку.",
      "すばやい茶色の狐がのろまな犬を飛び越える。",
      "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
      "El veloz murciélago hindú comía feliz cardillo y kiwi.",
  };
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i)
    docs.push_back(base[i % base.size()] + " " + std::to_string(i * 37) + "\n" + base[(i * 3) % base.size()]);
  return docs;
}

}  // namespace

TEST(SentencePiece, TrainsAndRoundTripsSeveralLanguagesAndOddBytes) {
  fs::path dir = temp_dir("roundtrip");
  std::string model = (dir / "m.model").string();
  px::text::train_sentencepiece(corpus(), model, {.vocab_size = 500});
  auto tok = px::text::load_tokenizer(model);
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_LE(tok->vocab_size(), 500);
  EXPECT_GT(tok->vocab_size(), 256);  // the 256 byte pieces plus learned ones
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->eos_id(), 3);
  const std::vector<std::string> texts = {
      "The quick brown fox.",
      "Der Fuchs springt über den Hund.",
      "лиса прыгает",
      "狐がのろまな犬",
      "αλεπού",
      "Zebras never seen: ქართული, עברית, 🦊🐕!",  // characters not in training: byte fallback
      "tabs\tand  double  spaces\nnew lines\n\n and trailing space ",
      std::string("control \x01\x7f bytes", 17),
      "  two leading spaces and a NUL \0 inside"s,
      "",
  };
  for (const auto& t : texts) {
    std::vector<int32_t> ids = tok->encode(t);
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok->vocab_size());
    }
    EXPECT_EQ(tok->decode(ids), t) << "text: " << t;
  }
  // Frequent words become multi-character pieces: fewer tokens than characters.
  const std::string frequent = "The quick brown fox jumps over the lazy dog.";
  EXPECT_LT(tok->encode(frequent).size() * 4, frequent.size() * 3);
  // Bytes that are not UTF-8 cannot come back: they encode (as the unknown piece) without error.
  EXPECT_FALSE(tok->encode("bad \xff\xfe bytes").empty());
  EXPECT_NE(error_of([&] { tok->decode({static_cast<int32_t>(tok->vocab_size())}); }).find("outside the vocabulary"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(SentencePiece, TrainingIsDeterministic) {
  fs::path dir = temp_dir("determinism");
  px::text::train_sentencepiece(corpus(), (dir / "a.model").string(), {.vocab_size = 450, .max_sentences = 30, .seed = 7});
  px::text::train_sentencepiece(corpus(), (dir / "b.model").string(), {.vocab_size = 450, .max_sentences = 30, .seed = 7});
  EXPECT_EQ(slurp(dir / "a.model"), slurp(dir / "b.model"));
  fs::remove_all(dir);
}

TEST(SentencePiece, ClearErrors) {
  fs::path dir = temp_dir("errors");
  std::ofstream(dir / "bad.model") << "this is not a protobuf";
  std::string e = error_of([&] { px::text::load_tokenizer((dir / "bad.model").string()); });
  EXPECT_NE(e.find("bad.model"), std::string::npos) << e;
  EXPECT_NE(e.find("not a valid SentencePiece model"), std::string::npos) << e;

  std::ofstream(dir / "vocab.txt") << "a\nb\n";
  e = error_of([&] { px::text::load_tokenizer((dir / "vocab.txt").string()); });
  EXPECT_NE(e.find("vocab.txt"), std::string::npos) << e;
  EXPECT_NE(e.find("supported kinds"), std::string::npos) << e;

  e = error_of([&] { px::text::load_tokenizer((dir / "missing.model").string()); });
  EXPECT_NE(e.find("missing.model' does not exist"), std::string::npos) << e;

  e = error_of([&] { px::text::train_sentencepiece({}, (dir / "x.model").string()); });
  EXPECT_NE(e.find("empty corpus"), std::string::npos) << e;
  fs::remove_all(dir);
}
