// Adafactor against the published algorithm (Shazeer & Stern 2018), in double precision.
#include <cmath>

#include "optim/optim_testing.h"

namespace px::optim {
namespace {

using px::testing::all_close;
using px::testing::random_array;
using testing::Stepper;
using testing::to_double;
using testing::to_float;

using Vec = std::vector<double>;

// A reference for one param of shape [B..., R, C] (factored) or any shape (unfactored).
struct AdafactorRef {
  AdafactorOptions o;
  Shape shape;
  bool factored;
  Vec row, col, v, m;

  AdafactorRef(AdafactorOptions opt, Shape s, bool f) : o(std::move(opt)), shape(std::move(s)), factored(f) {
    int64_t n = numel(shape);
    if (factored) {
      int64_t c = shape.back(), r = shape[shape.size() - 2], b = n / (r * c);
      row.assign(b * r, 0.0);
      col.assign(b * c, 0.0);
    } else {
      v.assign(n, 0.0);
    }
    m.assign(n, 0.0);
  }

  static double rms(const Vec& x) {
    double s = 0;
    for (double e : x) s += e * e;
    return std::sqrt(s / x.size());
  }

  void step(Vec& p, const Vec& g, int t) {
    const int64_t n = p.size();
    double rho = o.relative_step ? std::min(1e-2, 1.0 / std::sqrt(t)) : o.lr.at(t);
    double beta2 = 1.0 - std::pow(t, -o.decay_rate);
    Vec u(n);
    if (factored) {
      int64_t c = shape.back(), r = shape[shape.size() - 2], b = n / (r * c);
      for (int64_t bi = 0; bi < b; ++bi) {
        for (int64_t i = 0; i < r; ++i) {
          double s = 0;
          for (int64_t j = 0; j < c; ++j) s += g[(bi * r + i) * c + j] * g[(bi * r + i) * c + j] + o.eps1;
          row[bi * r + i] = beta2 * row[bi * r + i] + (1 - beta2) * s / c;
        }
        for (int64_t j = 0; j < c; ++j) {
          double s = 0;
          for (int64_t i = 0; i < r; ++i) s += g[(bi * r + i) * c + j] * g[(bi * r + i) * c + j] + o.eps1;
          col[bi * c + j] = beta2 * col[bi * c + j] + (1 - beta2) * s / r;
        }
        double row_mean = 0;
        for (int64_t i = 0; i < r; ++i) row_mean += row[bi * r + i] / r;
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < c; ++j) {
            double vhat = row[bi * r + i] * col[bi * c + j] / row_mean;
            u[(bi * r + i) * c + j] = g[(bi * r + i) * c + j] / std::sqrt(vhat);
          }
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        v[i] = beta2 * v[i] + (1 - beta2) * (g[i] * g[i] + o.eps1);
        u[i] = g[i] / std::sqrt(v[i]);
      }
    }
    double denom = std::max(1.0, rms(u) / o.clip_threshold);
    for (auto& e : u) e /= denom;
    double alpha = o.scale_parameter ? rho * std::max(o.eps2, rms(p)) : rho;
    if (o.beta1) {
      for (int64_t i = 0; i < n; ++i) m[i] = *o.beta1 * m[i] + (1 - *o.beta1) * u[i];
      u = m;
    }
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] - alpha * u[i] - alpha * o.weight_decay * p[i];
  }
};

void run_case(const AdafactorOptions& opt, const std::vector<Shape>& shapes, const std::vector<bool>& factored,
              int steps = 3) {
  std::vector<Array> params;
  std::vector<AdafactorRef> refs;
  std::vector<Vec> p;
  for (size_t k = 0; k < shapes.size(); ++k) {
    params.push_back(random_array(shapes[k], DType::f32, 30 + k));
    p.push_back(to_double(params.back()));
    refs.emplace_back(opt, shapes[k], factored[k]);
  }
  Stepper st(adafactor(opt), params);
  for (int t = 1; t <= steps; ++t) {
    std::vector<Array> gs;
    for (size_t k = 0; k < shapes.size(); ++k)
      gs.push_back(random_array(shapes[k], DType::f32, 50 + 7 * t + k, -1.5f, 1.5f));
    double lr = st.step(gs, t);
    EXPECT_NEAR(lr, adafactor(opt)->lr_at(t), 1e-7);
    for (size_t k = 0; k < shapes.size(); ++k) {
      refs[k].step(p[k], to_double(gs[k]), t);
      EXPECT_TRUE(all_close(st.params()[k].to_f32(), to_float(p[k]), 1e-6, 2e-5))
          << "param " << k << " " << shape_str(shapes[k]) << " step " << t;
    }
  }
}

TEST(Adafactor, PaperDefaultsFactoredAndUnfactored) { run_case({}, {{3, 4}, {5}, {2, 3, 4}}, {true, false, true}); }

TEST(Adafactor, UpdateClippingEngages) {
  // With a threshold below 1 the first update (RMS about 1) is always clipped.
  run_case({.clip_threshold = 0.3}, {{4, 3}, {6}}, {true, false});
}

TEST(Adafactor, MomentumWeightDecayAndAbsoluteSteps) {
  run_case({.lr = warmup_cosine(0.05, 1, 10),
            .relative_step = false,
            .scale_parameter = false,
            .beta1 = 0.9,
            .weight_decay = 0.1},
           {{3, 5}, {4}}, {true, false}, 4);
}

TEST(Adafactor, MinDimSizeKeepsSmallMatricesUnfactored) {
  AdafactorOptions opt{.min_dim_size_to_factor = 4};
  auto slots = adafactor(opt)->state_slots({{DType::f32, {3, 8}}, {DType::f32, {2, 4, 5}}, {DType::f32, {7}}});
  ASSERT_EQ(slots.size(), 4u);
  EXPECT_EQ(slots[0].name, "v");
  EXPECT_EQ(slots[0].type.shape, (Shape{3, 8}));
  EXPECT_EQ(slots[1].name, "v_row");
  EXPECT_EQ(slots[1].type.shape, (Shape{2, 4}));
  EXPECT_EQ(slots[2].name, "v_col");
  EXPECT_EQ(slots[2].type.shape, (Shape{2, 5}));
  EXPECT_EQ(slots[3].name, "v");
  run_case(opt, {{3, 8}, {2, 4, 5}}, {false, true});
  auto with_m = adafactor({.beta1 = 0.5})->state_slots({{DType::f32, {2, 2}}});
  ASSERT_EQ(with_m.size(), 3u);
  EXPECT_EQ(with_m[2].name, "m");
}

TEST(Adafactor, FactoredMemoryIsSublinear) {
  auto types = adafactor()->state_types({{DType::f32, {512, 1024}}});
  int64_t n = 0;
  for (auto& t : types) n += t.numel();
  EXPECT_EQ(n, 512 + 1024);
}

TEST(Adafactor, BadOptions) {
  try {
    adafactor({.clip_threshold = 0});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[adafactor] clip_threshold"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace px::optim
