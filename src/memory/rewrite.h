// Shared by the memory passes (remat, offload), which rebuild a traced step node by node, and by
// the training step's memory report.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px {
struct StepProgram;
}

namespace px::memory_pass {

// Readers of one fetched copy: readers further apart than this (in nodes of the traced step) fetch
// again, so that the copy is freed in between (a layer's params between its forward and backward).
constexpr int kFetchReuseNodes = 24;

// Appends a `transfer` of value v to `to` (with an optional prefetch group) to `nodes`, with the
// node facts `at`, adding its result to `values` (v's facts, living in `to`); returns its id.
int add_transfer(std::vector<Node>& nodes, std::vector<ValueInfo>& values, int v, MemoryKind to, const NodeFacts& at,
                 const std::string& group = "");

// The graph of `nodes` over `values` (producers renumbered) with the inputs of `like`; verified.
std::unique_ptr<Graph> rebuilt(std::vector<Node> nodes, std::vector<ValueInfo> values, const Graph& like,
                               std::vector<int> outputs);

// The layer a param belongs to: its path up to the first numeric component ("blocks.3.attn.wq" ->
// "blocks.3"); outside numbered blocks, its module ("final_norm.scale" -> "final_norm").
std::string layer_of(const std::string& path);

// Per node: 0 forward (computes the loss), 1 backward (computes a gradient), 2 clipping and update.
// Read from what the values hold (the loss output, the values in MemoryCategory::gradients: so a
// node that feeds both is forward, one that feeds neither is update), else from the nodes' facts.
std::vector<char> phases(const StepProgram& p);

// Sets the layer of every value of p's graph (see layer_of; "" for the batch and what depends on
// no param), for the memory report's largest users and the over-limit error.
void label_layers(StepProgram& p);

// The offload rewrite of one program (offload_step for a whole step; each program of a pipelined
// step): where each input lives and which nodes are clipping and update.
struct OffloadRewrite {
  std::vector<MemoryKind> in_kind;                  // per input: device or pinned_host
  std::vector<std::string> group;                   // per input: its prefetch group (a param's layer)
  std::vector<char> update;                         // per node: clipping or update
  std::vector<std::optional<MemoryKind>> out_kind;  // per output: where it is left (none: where computed)
  bool host_update = false;                         // every update node runs on the host
};
// g with every device use of a pinned_host value reading a fetched copy (one per cluster of nearby
// uses), update nodes on the host where `host_update` or they read the host, and values crossing
// to the other memory transferred (each transfer with the facts of the node it is emitted for).
std::unique_ptr<Graph> offload_program(const Graph& g, const OffloadRewrite& r);

// g with each node that has a decomposition and reads a value `offloaded` marks replaced by its
// decomposition (so that the elementwise parts reading it can run where it lives); null when there
// is none. Values and nodes keep their facts (replay).
std::unique_ptr<Graph> split_host_updates(const Graph& g, const std::vector<char>& offloaded);

}  // namespace px::memory_pass
