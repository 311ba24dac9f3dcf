#include <gtest/gtest.h>
#include <sys/stat.h>
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

// A 1 GiB single document in a .txt.gz ended in std::bad_alloc: files are read line by line and
// a document longer than max_document_bytes is an error naming the file and the line.
TEST(TextRead, ADocumentLongerThanTheLimitNamesFileAndLine) {
  fs::path d = temp_dir("long_doc");
  write(d / "a.txt", "short\n\n" + std::string(300, 'x') + "\n\nafter\n");
  std::string e = error_of([&] { px::data::read_documents({(d / "a.txt").string()}, 0, 100); });
  EXPECT_NE(e.find("[data] " + (d / "a.txt").string() + ":3: the document here is longer than 100 bytes "
                   "(max_document_bytes)"),
            std::string::npos) << e;
  EXPECT_NE(e.find("raise max_document_bytes (pax: data.max_document_bytes)"), std::string::npos) << e;
  // Many short lines make one long document: named by the line it starts on.
  std::string lines;
  for (int i = 0; i < 30; ++i) lines += "0123456789\n";
  write_gz(d / "b.txt.gz", "one\n\n\n" + lines);
  e = error_of([&] { px::data::read_documents({(d / "b.txt.gz").string()}, 0, 100); });
  EXPECT_NE(e.find((d / "b.txt.gz").string() + ":4: the document here is longer than 100 bytes"), std::string::npos)
      << e;
  write(d / "c.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"" + std::string(200, 'y') + "\"}\n");
  e = error_of([&] { px::data::read_documents({(d / "c.jsonl").string()}, 0, 100); });
  EXPECT_NE(e.find((d / "c.jsonl").string() + ":2: the document here is longer than 100 bytes"), std::string::npos)
      << e;
  // At the limit it is read; the default limit is 64 MiB.
  EXPECT_EQ(px::data::read_documents({(d / "a.txt").string()}, 0, 300).size(), 3u);
  EXPECT_EQ(px::data::read_documents({(d / "a.txt").string()}).size(), 3u);
  EXPECT_NE(error_of([&] { px::data::read_documents({(d / "a.txt").string()}, 0, 0); }).find("must be >= 1"),
            std::string::npos);
  fs::remove_all(d);
}

// A small .gz that inflates to a GiB was read whole: inflating stops at a stated bound.
TEST(TextRead, DecompressionIsBounded) {
  fs::path d = temp_dir("bomb");
  write_gz(d / "bomb.txt.gz", std::string(4 << 20, 'x'));  // 4 MiB in about 4 KiB
  const std::string bomb = (d / "bomb.txt.gz").string();
  std::string e = error_of([&] { px::data::read_maybe_gz(bomb, 0, 1 << 20); });
  EXPECT_NE(e.find("'" + bomb + "' inflates to more than 1 MiB from "), std::string::npos) << e;
  EXPECT_NE(e.find("at most 100x its size (or 1 MiB)"), std::string::npos) << e;
  EXPECT_NE(e.find("decompress it yourself and give the plain file"), std::string::npos) << e;
  EXPECT_EQ(px::data::read_maybe_gz(bomb, 0, 8 << 20).size(), size_t{4} << 20);  // under the bound: read
  // Through the public reader, with the default bound (64 MiB, or 100x): 65 MiB of one byte.
  gzFile f = gzopen((d / "big.txt.gz").c_str(), "wb1");
  ASSERT_NE(f, nullptr);
  const std::string mib(1 << 20, 'y');
  for (int i = 0; i < 65; ++i) ASSERT_EQ(gzwrite(f, mib.data(), static_cast<unsigned>(mib.size())), 1 << 20);
  gzclose(f);
  e = error_of([&] { px::data::read_documents({(d / "big.txt.gz").string()}); });
  EXPECT_NE(e.find("big.txt.gz' inflates to more than 64 MiB"), std::string::npos) << e;
  // A plain file inflates to itself: any size is read.
  write(d / "plain.txt", std::string(4 << 20, 'x'));
  EXPECT_EQ(px::data::read_maybe_gz((d / "plain.txt").string(), 0, 0).size(), size_t{4} << 20);
  e = error_of([&] { px::data::read_maybe_gz(bomb, 0, 1000); });
  const uint64_t stored = fs::file_size(bomb);
  EXPECT_NE(e.find("inflates to more than " + std::to_string(100 * stored) + " bytes from " + std::to_string(stored) +
                   " bytes"),
            std::string::npos)
      << e;
  fs::remove_all(d);
}

// A FIFO opened for reading waits for a writer: data paths that are not regular files are refused.
TEST(TextRead, NonRegularFilesAreRefused) {
  fs::path d = temp_dir("fifo");
  const std::string fifo = (d / "pipe.txt").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string e = error_of([&] { px::data::read_documents({fifo}); });
  EXPECT_EQ(e, "[data] data path '" + fifo +
                   "' is a FIFO (named pipe), not a regular file; give a regular file (a pipe, device or directory "
                   "cannot be read as one)");
  e = error_of([&] { px::data::read_documents({"/dev/zero"}); });
  EXPECT_NE(e.find("'/dev/zero' is a character device"), std::string::npos) << e;
  e = error_of([&] { px::data::read_maybe_gz(fifo); });
  EXPECT_NE(e.find("[data] '" + fifo + "' is a FIFO"), std::string::npos) << e;
  // In a directory, only regular files are read; the FIFO is passed over.
  write(d / "a.txt", "one\n\ntwo");
  EXPECT_EQ(px::data::read_documents({d.string()}), (std::vector<std::string>{"one", "two"}));
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
