// The f32 GEMM candidates on the matmul shapes of a bench-gpt training step, in one run: Debian's
// oneDNN 2.6 (`dnnl_sgemm`, what the CPU backend calls), an own packed GEMM with AVX-512 and AVX2
// microkernels (bench/own_gemm.h), and, where they are installed, oneDNN 3.x from the PyPI wheels
// (loaded with dlopen so that two oneDNN versions share the process), BLIS (Debian's
// libblis4-openmp, through its CBLAS interface) and libxsmm (Debian's libxsmm-dev, linked when the
// build found it). Every candidate's result is checked against oneDNN 2.6's, and every rate is set
// beside the FMA-loop peak measured in the same run. bench/gemm_candidates.sh installs the
// optional libraries and runs it.
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "own_gemm.h"
#include "peak.h"

#ifdef PX_HAVE_LIBXSMM
extern "C" {
void libxsmm_init(void);
void libxsmm_sgemm_omp_(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                        const int*, const float*, const int*, const float*, float*, const int*);
}
#endif

namespace {

// Row-major C[m,n] = op(A) op(B) (alpha 1, beta 0), the signature every candidate is wrapped in.
using Gemm = std::function<void(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                const float* b, int64_t ldb, float* c, int64_t ldc)>;

struct Candidate {
  std::string impl, version;
  Gemm gemm;
};

using SgemmFn = dnnl_status_t (*)(char, char, dnnl_dim_t, dnnl_dim_t, dnnl_dim_t, float, const float*, dnnl_dim_t,
                                  const float*, dnnl_dim_t, float, float*, dnnl_dim_t);

// oneDNN 3.x from a wheel's libdnnl.so.3, in its own symbol scope.
bool load_onednn(const std::string& path, std::vector<Candidate>& out, std::string& why) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == nullptr) {
    why = dlerror();
    return false;
  }
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "dnnl_sgemm"));
  auto version = reinterpret_cast<const dnnl_version_t* (*)()>(dlsym(h, "dnnl_version"));
  if (sgemm == nullptr || version == nullptr) {
    why = "no dnnl_sgemm or dnnl_version in " + path;
    return false;
  }
  const dnnl_version_t* v = version();
  const std::string ver = std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  const std::string runtime = v->cpu_runtime == 2     ? "omp"
                              : v->cpu_runtime == 4   ? "tbb"
                              : v->cpu_runtime == 512 ? "sycl"
                                                      : "runtime" + std::to_string(v->cpu_runtime);
  out.push_back(
      {"onednn" + std::to_string(v->major) + "_" + runtime, ver,
       [sgemm](char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float* c, int64_t ldc) { sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 0.f, c, ldc); }});
  return true;
}

// BLIS through CBLAS (Debian builds it with 32-bit BLAS integers).
bool load_blis(const std::string& path, std::vector<Candidate>& out, std::string& why) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == nullptr) {
    why = dlerror();
    return false;
  }
  using Cblas = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
  auto cblas = reinterpret_cast<Cblas>(dlsym(h, "cblas_sgemm"));
  auto info = reinterpret_cast<const char* (*)()>(dlsym(h, "bli_info_get_version_str"));
  if (cblas == nullptr) {
    why = "no cblas_sgemm in " + path;
    return false;
  }
  constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
  out.push_back({"blis", info ? info() : "?",
                 [cblas](char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                         int64_t ldb, float* c, int64_t ldc) {
                   cblas(kRowMajor, ta == 'T' ? kTrans : kNoTrans, tb == 'T' ? kTrans : kNoTrans, static_cast<int>(m),
                         static_cast<int>(n), static_cast<int>(k), 1.f, a, static_cast<int>(lda), b,
                         static_cast<int>(ldb), 0.f, c, static_cast<int>(ldc));
                 }});
  return true;
}

struct Shape {
  char ta, tb;
  int64_t m, n, k;
  std::string label;
};

}  // namespace

int main(int argc, char** argv) {
  using px::bench::Json;
  double min_time = 0.3;
  std::vector<std::string> onednn_paths;
  std::string blis_path = "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4";
  bool avx2_only = false;  // --isa=avx2: what a CPU without AVX-512 gets, on this one
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f.rfind("--min_time=", 0) == 0) {
      min_time = std::stod(f.substr(11));
    } else if (f.rfind("--onednn=", 0) == 0) {
      onednn_paths.push_back(f.substr(9));
    } else if (f.rfind("--blis=", 0) == 0) {
      blis_path = f.substr(7);
    } else if (f == "--isa=avx2") {
      avx2_only = true;
      // Read by each library at its first call, where it honours them.
      setenv("DNNL_MAX_CPU_ISA", "AVX2", 1);
      setenv("LIBXSMM_TARGET", "hsw", 1);
      setenv("BLIS_ARCH_TYPE", "haswell", 1);
    } else {
      std::fprintf(stderr,
                   "unknown flag %s (flags: --min_time=SECONDS, --onednn=PATH/libdnnl.so.3 (repeatable), "
                   "--blis=PATH/libblis.so.4, --isa=avx2)\n",
                   f.c_str());
      return 2;
    }
  }
  const int threads = px::bench::threads();

  std::vector<Candidate> cands;
  const dnnl_version_t* v2 = dnnl_version();
  cands.push_back(
      {"onednn2_omp", std::to_string(v2->major) + "." + std::to_string(v2->minor) + "." + std::to_string(v2->patch),
       [](char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc) { dnnl_sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 0.f, c, ldc); }});
  const px::bench::own_gemm::GemmIsa isa =
      avx2_only ? px::bench::own_gemm::GemmIsa::avx2 : px::bench::own_gemm::GemmIsa::best;
  cands.push_back({"own", avx2_only ? "avx2" : px::bench::own_gemm::gemm_f32_isa(),
                   [threads, isa](char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                  const float* b, int64_t ldb, float* c, int64_t ldc) {
                     px::bench::own_gemm::gemm_f32(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 0.f, c, ldc, threads, isa);
                   }});
  auto missing = [](const std::string& impl, const std::string& why) {
    Json().s("bench", "gemm_candidate").s("impl", impl).b("available", false).s("why", why).print();
  };
  for (const std::string& p : onednn_paths) {
    std::string why;
    if (!load_onednn(p, cands, why)) missing("onednn3", why);
  }
  if (std::string why; !load_blis(blis_path, cands, why)) missing("blis", why + " (apt-get install libblis4-openmp)");
#ifdef PX_HAVE_LIBXSMM
  libxsmm_init();
  cands.push_back({"libxsmm", "1.17",
                   [](char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                      int64_t ldb, float* c, int64_t ldc) {
                     // Column-major: C^T = op(B)^T op(A)^T.
                     const int im = static_cast<int>(n), in = static_cast<int>(m), ik = static_cast<int>(k);
                     const int ilda = static_cast<int>(ldb), ildb = static_cast<int>(lda), ildc = static_cast<int>(ldc);
                     const float one = 1.f, zero = 0.f;
                     libxsmm_sgemm_omp_(&tb, &ta, &im, &in, &ik, &one, b, &ilda, a, &ildb, &zero, c, &ildc);
                   }});
#else
  missing("libxsmm", "not found at build time (apt-get install libxsmm-dev, then reconfigure)");
#endif

  // The matmuls of one bench-gpt layer and the head, 2048 tokens (batch 8 x seq 256): y = x w,
  // dx = dy w^T and dw = x^T dy for the qkv, attention output, FFN up and down, and logits.
  const int64_t T = 2048, d = 512, ff = 2048, vocab = 8192;
  struct Linear {
    int64_t in, out;
    const char* name;
  };
  std::vector<Shape> shapes;
  for (const Linear& l : {Linear{d, 3 * d, "qkv"}, Linear{d, d, "attn_out"}, Linear{d, ff, "ffn_up"},
                          Linear{ff, d, "ffn_down"}, Linear{d, vocab, "logits"}}) {
    shapes.push_back({'N', 'N', T, l.out, l.in, std::string(l.name) + "_fwd"});
    shapes.push_back({'N', 'T', T, l.in, l.out, std::string(l.name) + "_dx"});
    shapes.push_back({'T', 'N', l.in, l.out, T, std::string(l.name) + "_dw"});
  }

  const px::FmaPeak peak = px::measure_fma_peak(threads, avx2_only);
  Json().s("bench", "fma_peak").i("threads", threads).s("isa", peak.isa).n("f32_gflops", peak.f32_gflops).print();

  std::vector<double> flops_total(cands.size(), 0.0), seconds_total(cands.size(), 0.0);
  for (const Shape& s : shapes) {
    const int64_t a_rows = s.ta == 'N' ? s.m : s.k, a_cols = s.ta == 'N' ? s.k : s.m;
    const int64_t b_rows = s.tb == 'N' ? s.k : s.n, b_cols = s.tb == 'N' ? s.n : s.k;
    std::vector<float> a(static_cast<size_t>(a_rows * a_cols)), b(static_cast<size_t>(b_rows * b_cols));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (float& x : a) x = u(rng);
    for (float& x : b) x = u(rng);
    std::vector<float> ref(static_cast<size_t>(s.m * s.n)), c(ref.size());
    const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    for (size_t ci = 0; ci < cands.size(); ++ci) {
      float* out = ci == 0 ? ref.data() : c.data();
      auto call = [&] { cands[ci].gemm(s.ta, s.tb, s.m, s.n, s.k, a.data(), a_cols, b.data(), b_cols, out, s.n); };
      const double sec = px::bench::time_it(call, min_time);
      double max_rel = 0;
      if (ci > 0)
        for (size_t e = 0; e < ref.size(); ++e)
          max_rel = std::max(max_rel, std::abs(static_cast<double>(c[e]) - ref[e]) / (1.0 + std::abs(ref[e])));
      flops_total[ci] += flops;
      seconds_total[ci] += sec;
      Json()
          .s("bench", "gemm_candidate")
          .s("impl", cands[ci].impl)
          .s("shape", std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n))
          .s("layout",
             std::string{static_cast<char>(s.ta == 'N' ? 'n' : 't'), static_cast<char>(s.tb == 'N' ? 'n' : 't')})
          .s("label", s.label)
          .n("ms", sec * 1e3)
          .n("gflops", flops / sec / 1e9)
          .n("max_rel_diff_vs_onednn2", max_rel)
          .print();
    }
  }
  const double ref_rate = flops_total[0] / seconds_total[0];
  for (size_t ci = 0; ci < cands.size(); ++ci) {
    const double rate = flops_total[ci] / seconds_total[ci];
    Json()
        .s("bench", "gemm_candidates")
        .s("impl", cands[ci].impl)
        .s("version", cands[ci].version)
        .i("threads", threads)
        .n("step_shapes_gflops", rate / 1e9)
        .n("fraction_of_fma_peak", rate / 1e9 / peak.f32_gflops)
        .n("vs_onednn2", rate / ref_rate)
        .print();
  }
  return 0;
}
