// Rebuilding a graph node by node, for the passes that rewrite some of its nodes (autocast,
// narrowing, decomposing a primitive): the rest are emitted again as they are.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "parallax/graph.h"

namespace px {

// `rewrite(i, operands)` gives node i's results in the new graph (traced into it: it is the
// current graph while rewrite runs), or nothing to emit the node as it is (with its name). Values
// keep their facts, and the nodes emitted for node i take its facts. With value_map set, per value of g its id in the result (-1 where it has none).
using NodeRewrite = std::function<std::optional<std::vector<Tensor>>(size_t, const std::vector<Tensor>&)>;
std::unique_ptr<Graph> replay(const Graph& g, std::vector<int>* value_map, const NodeRewrite& rewrite);

}  // namespace px
