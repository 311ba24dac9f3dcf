// The default collective emitter (collective primitives into the local graph), and printing of
// what the partitioner inserted.
#include <sstream>

#include "ir/primitive.h"
#include "parallax/spmd.h"
#include "sharding/prims.h"

namespace px {

void CollectiveEmitter::bind(const Mesh* mesh, Tensor coords) {
  ensure_sharding_registered();
  mesh_ = mesh;
  coords_ = coords;
}

int64_t CollectiveEmitter::group_size(const std::vector<std::string>& axes) const {
  int64_t n = 1;
  for (auto& a : axes) n *= mesh_->axis_size(a);
  return n;
}

Tensor CollectiveEmitter::all_reduce(const Tensor& x, const std::vector<std::string>& axes, const std::string& reduce) {
  return emit1("all_reduce", {x}, Attrs{{"axes", join_axes(axes)}, {"group", group_size(axes)}, {"reduce", reduce}});
}

Tensor CollectiveEmitter::all_gather(const Tensor& x, const std::vector<std::string>& axes, int dim) {
  return emit1("all_gather", {x},
               Attrs{{"axes", join_axes(axes)}, {"group", group_size(axes)}, {"dim", static_cast<int64_t>(dim)}});
}

Tensor CollectiveEmitter::reduce_scatter(const Tensor& x, const std::vector<std::string>& axes, int dim,
                                         const std::string& reduce) {
  return emit1("reduce_scatter", {x},
               Attrs{{"axes", join_axes(axes)},
                     {"group", group_size(axes)},
                     {"dim", static_cast<int64_t>(dim)},
                     {"reduce", reduce}});
}

Tensor CollectiveEmitter::all_to_all(const Tensor& x, const std::vector<std::string>& axes, int split_dim,
                                     int concat_dim) {
  return emit1("all_to_all", {x},
               Attrs{{"axes", join_axes(axes)},
                     {"group", group_size(axes)},
                     {"split_dim", static_cast<int64_t>(split_dim)},
                     {"concat_dim", static_cast<int64_t>(concat_dim)}});
}

Tensor CollectiveEmitter::local_slice(const Tensor& x, const std::vector<std::string>& axes, int dim) {
  std::vector<int64_t> ids, sizes;
  for (auto& a : axes) ids.push_back(mesh_->require_axis(a, "local_slice"));
  for (auto& a : mesh_->axes()) sizes.push_back(a.size);
  return emit1("local_slice", {x, coords_},
               Attrs{{"axes", join_axes(axes)},
                     {"group", group_size(axes)},
                     {"dim", static_cast<int64_t>(dim)},
                     {"axis_ids", ids},
                     {"mesh", sizes}});
}

std::string CollectiveRecord::to_string() const {
  std::ostringstream os;
  os << (kind ? collective_name(*kind) : "local_slice");
  if (!reduce.empty()) os << "(" << reduce << ")";
  os << " over ";
  for (size_t i = 0; i < axes.size(); ++i) os << (i ? "," : "") << "'" << axes[i] << "'";
  if (kind == CollectiveKind::all_to_all)
    os << " split " << dim << " concat " << concat_dim;
  else if (dim >= 0)
    os << " dim " << dim;
  os << " of " << type_str(operand);
  if (result != operand) os << " -> " << type_str(result);
  return os.str();
}

std::string SpmdProgram::summary() const {
  std::ostringstream os;
  os << "spmd program on " << mesh.to_string() << "\n";
  for (size_t i = 0; i < in_shardings.size(); ++i) {
    std::string name = i < local->input_names().size() ? local->input_names()[i] : "";
    os << "  in " << i << (name.empty() ? "" : " '" + name + "'") << ": " << in_shardings[i].to_string() << "\n";
  }
  for (size_t i = 0; i < out_shardings.size(); ++i) os << "  out " << i << ": " << out_shardings[i].to_string() << "\n";
  os << "  collectives (" << collectives.size() << "):\n";
  for (auto& c : collectives) os << "    " << c.to_string() << (c.reason.empty() ? "" : "   # " + c.reason) << "\n";
  os << "local graph:\n" << local->to_string();
  return os.str();
}

}  // namespace px
