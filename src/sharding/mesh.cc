// Mesh: named axes over devices, coordinates, and the device groups collectives run on.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "parallax/sharding.h"

namespace px {

namespace {
// The most devices a mesh may hold: as many as PX_DEVICES may name (device ids are ints).
constexpr int64_t kMaxMeshDevices = 65536;

bool valid_axis_name(const std::string& n) {
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (n.empty() || !alpha(n[0])) return false;
  return std::all_of(n.begin(), n.end(), [&](char c) { return alpha(c) || (c >= '0' && c <= '9'); });
}
}  // namespace

Mesh::Mesh(std::vector<MeshAxis> axes, std::vector<int> device_ids, std::string platform)
    : axes_(std::move(axes)), platform_(std::move(platform)) {
  int64_t n = 1;
  std::set<std::string> seen;
  for (const MeshAxis& a : axes_) {
    if (a.name.empty()) throw Error("[mesh] axis names must not be empty");
    if (!valid_axis_name(a.name))
      throw UserError("[mesh] axis name '" + a.name +
                      "' is not a name; axis names are letters, digits and '_', not starting with a digit (e.g. "
                      "data, model, fsdp)");
    if (!seen.insert(a.name).second) throw Error("[mesh] axis '" + a.name + "' appears twice");
    if (a.size < 1) throw Error("[mesh] axis '" + a.name + "' has size " + std::to_string(a.size) + "; sizes are >= 1");
    if (__builtin_mul_overflow(n, a.size, &n) || n > kMaxMeshDevices) {
      std::string sizes;
      for (const MeshAxis& b : axes_) sizes += (sizes.empty() ? "" : ", ") + b.name + ": " + std::to_string(b.size);
      throw UserError(fmt::format("[mesh] the axes {{{}}} hold more than {} devices; use smaller axis sizes", sizes,
                                  kMaxMeshDevices));
    }
  }
  if (device_ids.empty()) {
    device_ids.resize(static_cast<size_t>(n));
    std::iota(device_ids.begin(), device_ids.end(), 0);
  }
  if (static_cast<int64_t>(device_ids.size()) != n)
    throw Error("[mesh] the axes hold " + std::to_string(n) + " devices but " + std::to_string(device_ids.size()) +
                " device ids were given");
  for (int id : device_ids)
    if (id < 0 || id >= kMaxMeshDevices)
      throw UserError("[mesh] device id " + std::to_string(id) + " is out of range; device ids are 0 .. " +
                      std::to_string(kMaxMeshDevices - 1) +
                      " (the devices' indices in PX_DEVICES, e.g. 0 .. 7 for cpu:8)");
  if (std::set<int>(device_ids.begin(), device_ids.end()).size() != device_ids.size())
    throw Error("[mesh] a device id appears twice");
  device_ids_ = std::move(device_ids);
}

Mesh Mesh::cpu(const std::vector<std::pair<std::string, int64_t>>& axes) {
  std::vector<MeshAxis> a;
  for (auto& [name, size] : axes) a.push_back({name, size, Link{}});
  return Mesh(std::move(a), {}, "cpu");
}

std::vector<std::string> Mesh::axis_names() const {
  std::vector<std::string> n;
  for (auto& a : axes_) n.push_back(a.name);
  return n;
}

int Mesh::axis_index(const std::string& name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name) return static_cast<int>(i);
  return -1;
}

int Mesh::require_axis(const std::string& name, const std::string& context) const {
  int i = axis_index(name);
  if (i >= 0) return i;
  std::string have;
  for (auto& a : axes_) have += (have.empty() ? "'" : ", '") + a.name + "'";
  throw Error("[" + context + "] unknown mesh axis '" + name + "'; the mesh " + to_string() +
              (have.empty() ? " has no axes" : " has " + have));
}

int64_t Mesh::axis_size(const std::string& name) const { return axes_[require_axis(name, "mesh")].size; }

std::vector<int64_t> Mesh::coords(int position) const {
  std::vector<int64_t> c(axes_.size());
  int64_t p = position;
  for (int i = rank() - 1; i >= 0; --i) {
    c[i] = p % axes_[i].size;
    p /= axes_[i].size;
  }
  return c;
}

int Mesh::position(const std::vector<int64_t>& coords) const {
  int64_t p = 0;
  for (int i = 0; i < rank(); ++i) p = p * axes_[i].size + coords.at(i);
  return static_cast<int>(p);
}

int64_t Mesh::group_size(const std::vector<int>& axes) const {
  int64_t n = 1;
  for (int a : axes) n *= axes_.at(a).size;
  return n;
}

int64_t Mesh::index_in_group(int position, const std::vector<int>& axes) const {
  std::vector<int64_t> c = coords(position);
  int64_t k = 0;
  for (int a : axes) k = k * axes_[a].size + c[a];
  return k;
}

std::vector<std::vector<int>> Mesh::groups(const std::vector<int>& axes) const {
  // A position's group is numbered by its coordinates outside `axes` (row-major), which is also
  // the order of the groups' first members; its place in the group by its coordinates on `axes`.
  std::vector<char> in_group(axes_.size(), 0);
  for (int a : axes) {
    if (in_group.at(a)) throw Error("[mesh] groups: axis '" + axes_[a].name + "' given twice");
    in_group[a] = 1;
  }
  const int64_t gsize = group_size(axes);
  std::vector<std::vector<int>> out(static_cast<size_t>(size() / gsize), std::vector<int>(gsize, -1));
  std::vector<int64_t> c(axes_.size(), 0);  // the coordinates of p, counted up row-major
  for (int p = 0; p < size(); ++p) {
    int64_t key = 0, k = 0;
    for (int i = 0; i < rank(); ++i)
      if (!in_group[i]) key = key * axes_[i].size + c[i];
    for (int a : axes) k = k * axes_[a].size + c[a];
    out[static_cast<size_t>(key)][static_cast<size_t>(k)] = p;
    for (int i = rank() - 1; i >= 0; --i) {
      if (++c[i] < axes_[i].size) break;
      c[i] = 0;
    }
  }
  return out;
}

Mesh Mesh::with_processes(int64_t n) const {
  if (n < 1 || size() % n != 0)
    throw Error(fmt::format("[mesh] {} cannot be split over {} processes: use a process count >= 1 that divides "
                            "its {} devices",
                            to_string(), n, size()));
  std::vector<int> p(static_cast<size_t>(size()));
  const int64_t per = size() / n;
  for (int64_t i = 0; i < size(); ++i) p[i] = static_cast<int>(i / per);
  return with_process_of(std::move(p));
}

Mesh Mesh::with_process_of(std::vector<int> process_of_position) const {
  return with_process_of(std::move(process_of_position), 0);
}

// num_processes = 0: as many as the indices name, each holding a position.
Mesh Mesh::with_process_of(std::vector<int> process_of_position, int num_processes) const {
  if (static_cast<int64_t>(process_of_position.size()) != size())
    throw Error(fmt::format("[mesh] {} processes given for the {} positions of {}; give one per position",
                            process_of_position.size(), size(), to_string()));
  const int limit = num_processes > 0 ? num_processes : static_cast<int>(size());
  int count = 0;
  for (int p : process_of_position) {
    if (p < 0 || p >= limit)
      throw Error(fmt::format("[mesh] process index {} for a mesh of {} devices over {} processes; processes are "
                              "0 .. {}",
                              p, size(), limit, limit - 1));
    count = std::max(count, p + 1);
  }
  if (num_processes > 0) count = num_processes;
  auto procs = std::make_shared<Processes>();
  procs->count = count;
  procs->positions.resize(static_cast<size_t>(count));
  procs->local_index.resize(process_of_position.size());
  for (size_t q = 0; q < process_of_position.size(); ++q) {
    auto& mine = procs->positions[process_of_position[q]];
    procs->local_index[q] = static_cast<int>(mine.size());
    mine.push_back(static_cast<int>(q));
  }
  for (int p = 0; p < count && num_processes == 0; ++p)
    if (procs->positions[p].empty())
      throw Error(fmt::format("[mesh] process {} holds no position of {}; number the processes 0 .. n-1 with "
                              "at least one position each",
                              p, to_string()));
  procs->process_of = std::move(process_of_position);
  Mesh m = *this;
  m.procs_ = count > 1 ? std::move(procs) : nullptr;
  return m;
}

int Mesh::num_processes() const { return procs_ ? procs_->count : 1; }

int Mesh::process_of(int position) const {
  if (position < 0 || position >= size())
    throw Error(fmt::format("[mesh] position {} is not in {} (positions 0 .. {})", position, to_string(),
                            size() - 1));
  return procs_ ? procs_->process_of[position] : 0;
}

int Mesh::local_index(int position) const {
  if (position < 0 || position >= size())
    throw Error(fmt::format("[mesh] position {} is not in {} (positions 0 .. {})", position, to_string(),
                            size() - 1));
  return procs_ ? procs_->local_index[position] : position;
}

std::vector<int> Mesh::local_positions(int process) const {
  if (process < 0 || process >= num_processes())
    throw Error(fmt::format("[mesh] process {} is not one of the {} process(es) of {}", process, num_processes(),
                            to_string()));
  if (procs_) return procs_->positions[process];
  std::vector<int> all(static_cast<size_t>(size()));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

std::vector<int> Mesh::process_layout() const {
  return procs_ ? procs_->process_of : std::vector<int>(static_cast<size_t>(size()), 0);
}

std::string Mesh::to_string() const {
  std::ostringstream os;
  os << "Mesh{";
  for (size_t i = 0; i < axes_.size(); ++i) os << (i ? ", " : "") << axes_[i].name << ": " << axes_[i].size;
  os << "} on " << platform_ << ":" << size();
  if (num_processes() > 1) os << " over " << num_processes() << " processes";
  return os.str();
}

bool Mesh::operator==(const Mesh& o) const {
  if (axes_.size() != o.axes_.size() || device_ids_ != o.device_ids_ || platform_ != o.platform_) return false;
  if (procs_ != o.procs_ && (num_processes() != o.num_processes() || process_layout() != o.process_layout()))
    return false;
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name != o.axes_[i].name || axes_[i].size != o.axes_[i].size) return false;
  return true;
}

}  // namespace px
