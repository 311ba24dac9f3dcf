// Time to build the text pipeline over the whole GCIDE corpus: the first time (read, train the
// tokenizer, tokenize) and again from the cache. One JSON object per result; cpu_seconds is the
// process's CPU time (all threads), a check on wall times taken on a busy machine.
//   ./build/bench/text_data_bench [cache_dir]
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "parallax/text_data.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const fs::path cache = argc > 1 ? argv[1] : fs::temp_directory_path() / "px_text_data_bench";
  fs::remove_all(cache);
  for (const char* run : {"first", "cached"}) {
    const std::clock_t c0 = std::clock();
    px::data::TextDataset ds({.paths = {"gcide"}, .cache_dir = cache.string()});
    const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    const auto& st = ds.stats();
    std::printf("{\"name\": \"gcide_dataset_%s\", \"documents\": %lld, \"vocab\": %lld, \"tokens\": %lld, "
                "\"train_sequences\": %lld, \"tokenizer_from_cache\": %s, \"tokens_from_cache\": %s, "
                "\"read_s\": %.3f, \"train_tokenizer_s\": %.3f, \"tokenize_s\": %.3f, \"seconds\": %.3f, "
                "\"cpu_seconds\": %.3f}\n",
                run, static_cast<long long>(st.documents), static_cast<long long>(ds.tokenizer().vocab_size()),
                static_cast<long long>(st.train_tokens + st.eval_tokens), static_cast<long long>(st.train_sequences),
                st.tokenizer_from_cache ? "true" : "false", st.tokens_from_cache ? "true" : "false", st.read_seconds,
                st.tokenizer_seconds, st.tokenize_seconds, st.total_seconds, cpu);
    std::fflush(stdout);
  }
  fs::remove_all(cache);
}
