#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "data/text_internal.h"
#include "parallax/text_data.h"
#include "testing.h"

namespace fs = std::filesystem;
using px::testing::error_of;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("px_test_read_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << s;
}

void write_gz(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, s.data(), static_cast<unsigned>(s.size())), static_cast<int>(s.size()));
  gzclose(f);
}

}  // namespace

TEST(TextRead, PlainTextDocumentsAreBlankLineSeparated) {
  fs::path d = temp_dir("plain");
  write(d / "a.txt", "first doc\nstill first\n\n\n  \nsecond doc\r\n\r\nthird");
  auto docs = px::data::read_documents({(d / "a.txt").string()});
  EXPECT_EQ(docs, (std::vector<std::string>{"first doc\nstill first", "second doc", "third"}));
  EXPECT_EQ(px::data::read_documents({(d / "a.txt").string()}, 2).size(), 2u);
  fs::remove_all(d);
}

TEST(TextRead, JsonLinesAndGzip) {
  fs::path d = temp_dir("jsonl");
  const std::string jsonl = "{\"text\": \"alpha \\u00e9\", \"url\": \"x\"}\n\n{\"text\": \"beta\\nline\"}\n";
  write(d / "plain.jsonl", jsonl);
  write_gz(d / "c4-train.00000-of-01024.json.gz", jsonl);
  write_gz(d / "notes.txt.gz", "one\n\ntwo\n");
  const std::vector<std::string> want = {"alpha \xc3\xa9", "beta\nline"};
  EXPECT_EQ(px::data::read_documents({(d / "plain.jsonl").string()}), want);
  EXPECT_EQ(px::data::read_documents({(d / "c4-train.00000-of-01024.json.gz").string()}), want);
  EXPECT_EQ(px::data::read_documents({(d / "notes.txt.gz").string()}), (std::vector<std::string>{"one", "two"}));
  fs::remove_all(d);
}

TEST(TextRead, BadJsonLineNamesFileAndLine) {
  fs::path d = temp_dir("badjson");
  write(d / "x.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"broken\"\n");
  std::string e = error_of([&] { px::data::read_documents({(d / "x.jsonl").string()}); });
  EXPECT_NE(e.find("x.jsonl:2: not valid JSON"), std::string::npos) << e;
  write(d / "y.jsonl", "{\"text\": \"ok\"}\n\n{\"body\": \"no text\"}\n");
  e = error_of([&] { px::data::read_documents({(d / "y.jsonl").string()}); });
  EXPECT_NE(e.find("y.jsonl:3: no \"text\" field"), std::string::npos) << e;
  write(d / "z.jsonl", "{\"text\": 5}\n");
  e = error_of([&] { px::data::read_documents({(d / "z.jsonl").string()}); });
  EXPECT_NE(e.find("z.jsonl:1: the \"text\" field is not a string"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(TextRead, DirectoriesAreSortedAndRecursive) {
  fs::path d = temp_dir("dir");
  write(d / "b.txt", "b1\n\nb2");
  write(d / "a" / "z.jsonl", "{\"text\": \"az\"}\n");
  write(d / "a" / "y.txt", "ay");
  write(d / "README.md", "not data");
  write(d / ".hidden.txt", "hidden");
  EXPECT_EQ(px::data::read_documents({d.string()}), (std::vector<std::string>{"ay", "az", "b1", "b2"}));
  EXPECT_EQ(px::data::read_documents({d.string()}, 3), (std::vector<std::string>{"ay", "az", "b1"}));
  fs::remove_all(d);
}

TEST(TextRead, ClearErrors) {
  fs::path d = temp_dir("errors");
  std::string e = error_of([&] { px::data::read_documents({(d / "nope.txt").string()}); });
  EXPECT_NE(e.find("nope.txt' does not exist"), std::string::npos) << e;
  e = error_of([&] { px::data::read_documents({}); });
  EXPECT_NE(e.find("no data paths"), std::string::npos) << e;
  fs::create_directories(d / "empty");
  write(d / "empty" / "x.csv", "a,b");
  e = error_of([&] { px::data::read_documents({(d / "empty").string()}); });
  EXPECT_NE(e.find("has no .txt"), std::string::npos) << e;
  write(d / "trunc.txt.gz", "");
  {
    std::string gz;
    write_gz(d / "full.txt.gz", std::string(100000, 'x'));
    std::ifstream f(d / "full.txt.gz", std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(f), {});
    write(d / "trunc.txt.gz", gz.substr(0, gz.size() / 2));
  }
  e = error_of([&] { px::data::read_documents({(d / "trunc.txt.gz").string()}); });
  EXPECT_NE(e.find("trunc.txt.gz' is corrupt or truncated"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(TextRead, GcideMarkupIsStripped) {
  const std::string block =
      "Abandon \\A*ban\"don\\ ([.a]*b[a^]n\"d[u^]n), v. t. [imp. & p. p.\n"
      "   {Abandoned} (-d[u^]nd); p. pr. & vb. n. {Abandoning}.] [OF.\n"
      "   abandoner.]\n"
      "   1. To cast or drive out; to banish. [Obs.]\n"
      "      [1913 Webster]\n"
      "\n"
      "            Being all this time abandoned from your bed. --Shak.\n"
      "      [1913 Webster]\n";
  EXPECT_EQ(px::data::gcide_entry_text(block),
            "Abandon, v. t. [imp. & p. p. Abandoned (-du\u0306nd); p. pr. & vb. n. Abandoning.] [OF. abandoner.] "
            "1. To cast or drive out; to banish. [Obs.]\n"
            "Being all this time abandoned from your bed. --Shak.");
}

TEST(TextRead, GcideCorpus) {
  auto docs = px::data::read_gcide(50);
  ASSERT_EQ(docs.size(), 50u);
  for (const auto& d : docs) {
    EXPECT_FALSE(d.empty());
    EXPECT_EQ(d.find('\\'), std::string::npos) << d;
    EXPECT_EQ(d.find('{'), std::string::npos) << d;
    EXPECT_EQ(d.find("[1913 Webster]"), std::string::npos) << d;
    EXPECT_EQ(d.find("00-database"), std::string::npos) << d;
  }
  // Through read_documents, with the same prefix.
  auto same = px::data::read_documents({"gcide"}, 50);
  EXPECT_EQ(same, docs);
  // Entries come in the dictionary's order, headword first, with their definitions.
  EXPECT_EQ(docs[1].rfind("1 adj. 1. used of a single unit or thing", 0), 0u) << docs[1];
}
