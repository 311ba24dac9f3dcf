// Private primitives (names start with "test_") that IR and runtime tests register so they do
// not depend on the op families. Call register_test_prims() before using them.
#pragma once

#include <mutex>

#include "backend/cpu/kernel.h"
#include "ir/primitive.h"

namespace px::testprims {

inline std::vector<TensorType> same_as_first(const std::vector<TensorType>& in, const Attrs&, const char* name,
                                             size_t arity) {
  if (in.size() != arity)
    throw Error(std::string("[") + name + "] takes " + std::to_string(arity) + " operands, got " +
                std::to_string(in.size()));
  for (auto& t : in)
    if (t != in[0])
      throw Error(std::string("[") + name + "] operands differ: " + type_str(in[0]) + " vs " + type_str(t));
  return {in[0]};
}

inline Tensor scale(const Tensor& x, double k) { return emit1("test_scale", {x}, {{"k", k}}); }
inline Tensor add2(const Tensor& a, const Tensor& b) { return emit1("test_add2", {a, b}); }
inline Tensor effect(const Tensor& x) { return emit1("test_effect", {x}); }
inline std::vector<Tensor> split2(const Tensor& x) { return emit("test_split2", {x}); }
inline Tensor fill(const Shape& s, double v) {
  return emit1("test_fill", {}, {{"shape", std::vector<int64_t>(s.begin(), s.end())}, {"v", v}});
}

inline void register_test_prims() {
  static std::once_flag once;
  std::call_once(once, [] {
    // test_scale: y = k * x (elementwise, differentiable, fusible).
    Primitive scale_p;
    scale_p.name = "test_scale";
    scale_p.attrs = {{"k", AttrKind::number}};
    scale_p.elementwise = true;
    scale_p.infer = [](const std::vector<TensorType>& in, const Attrs& a) {
      a.f("k");
      return same_as_first(in, a, "test_scale", 1);
    };
    scale_p.vjp = [](const VjpArgs& a) {
      return std::vector<Tensor>{scale(a.cotangents[0], a.attrs.f("k"))};
    };
    register_primitive(scale_p);
    cpu::EltwiseKernel scale_k;
    scale_k.f32 = [](const float* const* in, float* out, int64_t n, const float* p) {
      for (int64_t i = 0; i < n; ++i) out[i] = p[0] * in[0][i];
    };
    scale_k.params = [](const Attrs& a) { return std::vector<float>{static_cast<float>(a.f("k"))}; };
    cpu::register_eltwise(&get_primitive("test_scale"), scale_k);

    // test_add2: y = a + b (same shapes).
    Primitive add_p;
    add_p.name = "test_add2";
    add_p.elementwise = true;
    add_p.infer = [](const std::vector<TensorType>& in, const Attrs& a) { return same_as_first(in, a, "test_add2", 2); };
    add_p.vjp = [](const VjpArgs& a) { return std::vector<Tensor>{a.cotangents[0], a.cotangents[0]}; };
    register_primitive(add_p);
    cpu::EltwiseKernel add_k;
    add_k.f32 = [](const float* const* in, float* out, int64_t n, const float*) {
      for (int64_t i = 0; i < n; ++i) out[i] = in[0][i] + in[1][i];
    };
    cpu::register_eltwise(&get_primitive("test_add2"), add_k);

    // test_effect: an identity that must never be merged by CSE (stands for a side effect).
    Primitive eff_p;
    eff_p.name = "test_effect";
    eff_p.no_cse = true;
    eff_p.infer = [](const std::vector<TensorType>& in, const Attrs& a) { return same_as_first(in, a, "test_effect", 1); };
    register_primitive(eff_p);
    cpu::register_kernel(&get_primitive("test_effect"), [](const cpu::KernelSpec& s) -> cpu::Kernel {
      int64_t bytes = s.in[0].nbytes();
      return [bytes](const void* const* in, void* const* out) { std::memcpy(out[0], in[0], bytes); };
    });

    // test_split2: two outputs, (x, 2x); not elementwise-fusible because it has two results.
    Primitive split_p;
    split_p.name = "test_split2";
    split_p.infer = [](const std::vector<TensorType>& in, const Attrs& a) {
      auto t = same_as_first(in, a, "test_split2", 1);
      return std::vector<TensorType>{t[0], t[0]};
    };
    split_p.vjp = [](const VjpArgs& a) {
      Tensor d;
      if (a.cotangents[0].defined()) d = a.cotangents[0];
      if (a.cotangents[1].defined()) {
        Tensor d1 = scale(a.cotangents[1], 2.0);
        d = d.defined() ? add2(d, d1) : d1;
      }
      return std::vector<Tensor>{d};
    };
    register_primitive(split_p);
    cpu::register_kernel(&get_primitive("test_split2"), [](const cpu::KernelSpec& s) -> cpu::Kernel {
      int64_t n = s.in[0].numel();
      return [n](const void* const* in, void* const* out) {
        const float* x = static_cast<const float*>(in[0]);
        for (int64_t i = 0; i < n; ++i) {
          static_cast<float*>(out[0])[i] = x[i];
          static_cast<float*>(out[1])[i] = 2 * x[i];
        }
      };
    });

    // test_fill: a constant with no operands (emits into current_graph()).
    Primitive fill_p;
    fill_p.name = "test_fill";
    fill_p.attrs = {{"shape", AttrKind::ints}, {"v", AttrKind::number}};
    fill_p.infer = [](const std::vector<TensorType>& in, const Attrs& a) {
      const auto& s = a.ints("shape");
      return std::vector<TensorType>{{DType::f32, Shape(s.begin(), s.end())}};
    };
    register_primitive(fill_p);
    cpu::register_kernel(&get_primitive("test_fill"), [](const cpu::KernelSpec& s) -> cpu::Kernel {
      int64_t n = s.out[0].numel();
      float v = static_cast<float>(s.attrs.f("v"));
      return [n, v](const void* const*, void* const* out) {
        for (int64_t i = 0; i < n; ++i) static_cast<float*>(out[0])[i] = v;
      };
    });
  });
}

}  // namespace px::testprims
