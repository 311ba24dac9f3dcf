// Parallax: trace a model written in C++, differentiate it, and compile the training step.
//
//   #include <parallax/parallax.h>
//   px::nn::TransformerLm model(px::nn::gpt2_tiny());
//   px::TrainStep step(model.store(), px::optim::adamw({.lr = 3e-4}), loss_fn, batch_types);
#pragma once

#include "parallax/auto.h"
#include "parallax/autodiff.h"
#include "parallax/checkpoint.h"
#include "parallax/core.h"
#include "parallax/data.h"
#include "parallax/graph.h"
#include "parallax/memory.h"
#include "parallax/io.h"
#include "parallax/nn.h"
#include "parallax/ops.h"
#include "parallax/optim.h"
#include "parallax/parallel.h"
#include "parallax/pipeline.h"
#include "parallax/plan.h"
#include "parallax/remat.h"
#include "parallax/runtime.h"
#include "parallax/sharding.h"
#include "parallax/spmd.h"
#include "parallax/strategy.h"
#include "parallax/text.h"
#include "parallax/text_data.h"
#include "parallax/train.h"
