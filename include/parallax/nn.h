// px::nn: modules with path-named params, deterministic initialization, layers and
// GPT-2 / Llama style Transformer LMs. See docs/nn.md.
//
//   struct Mlp : px::nn::Module {
//     px::nn::Linear up, down;
//     Mlp(px::nn::Scope s, int d, int h) : Module(s), up(s.sub("up"), d, h), down(s.sub("down"), h, d) {}
//     px::Tensor operator()(const px::Tensor& x) const { return down(px::gelu(up(x))); }
//   };
//   px::nn::TransformerLm lm(px::nn::gpt2_tiny());
//   std::cout << lm.param_table();   // path, shape, dtype, count, init
#pragma once

#include "parallax/nn/layers.h"
#include "parallax/nn/module.h"
#include "parallax/nn/pretrained.h"
#include "parallax/nn/transformer.h"
