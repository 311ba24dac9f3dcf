// load_safetensors on arbitrary bytes: a px::Error or a file whose arrays match their headers.
#include <cstdlib>

#include "fuzz_util.h"
#include "parallax/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  px::fuzz::MemFile f(data, size);
  try {
    px::SafetensorsFile st = px::load_safetensors(f.path());
    if (st.names.size() != st.arrays.size()) std::abort();
    uint64_t total = 0;
    for (const px::Array& a : st.arrays) {
      if (!a.defined()) std::abort();
      total += static_cast<uint64_t>(a.nbytes());
      if (a.dtype() == px::DType::boolean)
        for (int64_t i = 0; i < a.numel(); ++i)
          if (a.data<uint8_t>()[i] > 1) std::abort();
    }
    if (total > size) std::abort();  // every byte of data comes from the file
  } catch (const px::Error&) {
  }
  return 0;
}
