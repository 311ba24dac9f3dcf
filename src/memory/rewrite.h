// Shared by the memory passes (remat, offload), which rebuild a traced step node by node.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px::memory_pass {

// Readers of one fetched copy: readers further apart than this (in nodes of the traced step) fetch
// again, so that the copy is freed in between (a layer's params between its forward and backward).
constexpr int kFetchReuseNodes = 24;

// Appends a `transfer` of value v to `to` (with an optional prefetch group) to `nodes`, adding its
// result to `values`; returns the result's id.
int add_transfer(std::vector<Node>& nodes, std::vector<ValueInfo>& values, int v, MemoryKind to,
                 const std::string& group = "");

// The graph of `nodes` over `values` (producers renumbered) with the inputs of `like`; verified.
std::unique_ptr<Graph> rebuilt(std::vector<Node> nodes, std::vector<ValueInfo> values, const Graph& like,
                               std::vector<int> outputs);

}  // namespace px::memory_pass
