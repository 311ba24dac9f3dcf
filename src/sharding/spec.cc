// PartitionSpec and Sharding: printing, parsing, validation with errors that say what would work.
#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include "parallax/sharding.h"

namespace px {

namespace {
const std::vector<std::string>& empty_axes() {
  static const std::vector<std::string> e;
  return e;
}

std::string quoted_list(const std::vector<std::string>& xs) {
  std::string s;
  for (auto& x : xs) s += (s.empty() ? "'" : ", '") + x + "'";
  return s;
}
}  // namespace

// ---- PartitionSpec ---------------------------------------------------------------------------

const std::vector<std::string>& PartitionSpec::operator[](int d) const {
  return d >= 0 && d < size() ? dims_[d].axes : empty_axes();
}

bool PartitionSpec::is_replicated() const {
  for (auto& d : dims_)
    if (!d.axes.empty()) return false;
  return true;
}

std::vector<std::string> PartitionSpec::used_axes() const {
  std::vector<std::string> u;
  for (auto& d : dims_) u.insert(u.end(), d.axes.begin(), d.axes.end());
  return u;
}

std::string PartitionSpec::to_string() const {
  std::ostringstream os;
  os << "P(";
  for (size_t i = 0; i < dims_.size(); ++i) {
    const auto& a = dims_[i].axes;
    os << (i ? ", " : "");
    if (a.empty()) {
      os << "None";
    } else if (a.size() == 1) {
      os << "'" << a[0] << "'";
    } else {
      os << "(" << quoted_list(a) << ")";
    }
  }
  os << ")";
  return os.str();
}

bool PartitionSpec::operator==(const PartitionSpec& o) const {
  int n = std::max(size(), o.size());
  for (int d = 0; d < n; ++d)
    if ((*this)[d] != o[d]) return false;
  return true;
}

PartitionSpec PartitionSpec::parse(const std::string& text) {
  size_t i = 0;
  auto fail = [&](const std::string& why) -> void {
    throw Error("[sharding] cannot parse partition spec \"" + text + "\" at character " + std::to_string(i) + ": " +
                why + " (expected e.g. P('data', None) or P(('data', 'fsdp'), 'model'))");
  };
  auto skip = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  auto expect = [&](char c) {
    skip();
    if (i >= text.size() || text[i] != c) fail(std::string("expected '") + c + "'");
    ++i;
  };
  auto name = [&]() -> std::string {
    skip();
    if (i >= text.size() || (text[i] != '\'' && text[i] != '"')) fail("expected a quoted axis name");
    char q = text[i++];
    size_t end = text.find(q, i);
    if (end == std::string::npos) fail("unterminated axis name");
    std::string n = text.substr(i, end - i);
    // Names must print back as parse reads them: '<name>' (fuzzing found "a'b" quoted with ").
    if (n.empty()) fail("an axis name is empty");
    for (char c : n)
      if (c == '\'' || c == '"' || static_cast<unsigned char>(c) < 0x20)
        fail("axis name \"" + n + "\" holds a quote or a control character");
    i = end + 1;
    return n;
  };
  skip();
  if (text.compare(i, 2, "P(") == 0)
    i += 1;
  else if (text.compare(i, 14, "PartitionSpec(") == 0)
    i += 13;
  expect('(');
  std::vector<Dim> dims;
  skip();
  if (i < text.size() && text[i] == ')') {
    ++i;
    return PartitionSpec(dims);
  }
  while (true) {
    skip();
    Dim d;
    if (text.compare(i, 4, "None") == 0) {
      i += 4;
    } else if (i < text.size() && text[i] == '(') {
      ++i;
      skip();
      while (i < text.size() && text[i] != ')') {
        d.axes.push_back(name());
        skip();
        if (i < text.size() && text[i] == ',') ++i;
        skip();
      }
      expect(')');
    } else {
      d.axes.push_back(name());
    }
    dims.push_back(d);
    skip();
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    expect(')');
    break;
  }
  skip();
  if (i != text.size()) fail("unexpected trailing text");
  return PartitionSpec(dims);
}

// ---- Sharding --------------------------------------------------------------------------------

int64_t Sharding::num_shards(int dim) const {
  int64_t n = 1;
  for (auto& a : spec[dim]) n *= mesh.axis_size(a);
  return n;
}

Shape Sharding::local_shape(const Shape& global) const {
  Shape s = global;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) s[d] /= num_shards(d);
  return s;
}

std::vector<int64_t> Sharding::shard_offsets(const Shape& global, int position) const {
  std::vector<int64_t> off(global.size(), 0);
  std::vector<int64_t> c = mesh.coords(position);
  for (int d = 0; d < static_cast<int>(global.size()); ++d) {
    int64_t k = 0;
    for (auto& a : spec[d]) {
      int ai = mesh.axis_index(a);
      k = k * mesh.axes()[ai].size + c[ai];
    }
    off[d] = k * (global[d] / num_shards(d));
  }
  return off;
}

void Sharding::validate(const TensorType& t, const std::string& what) const {
  std::string head = "[sharding] " + what + " " + type_str(t) + " with " + spec.to_string() + " on " + mesh.to_string();
  if (spec.size() > t.rank())
    throw Error(head + ": the spec has " + std::to_string(spec.size()) + " entries but the value has rank " +
                std::to_string(t.rank()) + "; give at most one entry per dim");
  std::set<std::string> used;
  for (int d = 0; d < spec.size(); ++d)
    for (auto& a : spec[d]) {
      if (mesh.axis_index(a) < 0)
        throw Error(head + ": dim " + std::to_string(d) + " names unknown mesh axis '" + a + "'; the mesh has " +
                    (mesh.rank() ? quoted_list(mesh.axis_names()) : std::string("no axes")));
      if (!used.insert(a).second)
        throw Error(head + ": mesh axis '" + a + "' is used twice (again on dim " + std::to_string(d) +
                    "); each axis may split at most one dim");
    }
  for (auto& a : partial) {
    if (mesh.axis_index(a) < 0)
      throw Error(head + ": partial-sum axis '" + a + "' is not a mesh axis; the mesh has " +
                  quoted_list(mesh.axis_names()));
    if (used.count(a)) throw Error(head + ": mesh axis '" + a + "' both splits a dim and holds partial sums");
    used.insert(a);
  }
  for (int d = 0; d < spec.size(); ++d) {
    int64_t n = num_shards(d);
    if (n > 0 && t.shape[d] % n == 0) continue;
    std::string axes;
    for (auto& a : spec[d])
      axes += (axes.empty() ? "" : " x ") + ("'" + a + "'(" + std::to_string(mesh.axis_size(a)) + ")");
    std::vector<std::string> fits;
    for (auto& ax : mesh.axes())
      if (ax.size > 1 && t.shape[d] % ax.size == 0 && !used.count(ax.name))
        fits.push_back("'" + ax.name + "'(" + std::to_string(ax.size) + ")");
    std::string fix = fits.empty() ? "no unused mesh axis divides it; leave dim " + std::to_string(d) + " unsplit"
                                   : "unused mesh axes that divide it: " + [&] {
                                       std::string s;
                                       for (auto& f : fits) s += (s.empty() ? "" : ", ") + f;
                                       return s;
                                     }();
    int64_t up = (t.shape[d] + n - 1) / n * n;
    throw Error(head + ": dim " + std::to_string(d) + " has size " + std::to_string(t.shape[d]) +
                ", not divisible by " + std::to_string(n) + " = " + axes + "; " + fix + ", or make dim " +
                std::to_string(d) + " a multiple of " + std::to_string(n) + " (e.g. " + std::to_string(up) + ")");
  }
}

std::string Sharding::to_string() const {
  std::string s = spec.to_string();
  if (!partial.empty()) {
    s += " partial(";
    for (size_t i = 0; i < partial.size(); ++i) s += (i ? "," : "") + partial[i];
    s += ")";
  }
  return s;
}

bool Sharding::operator==(const Sharding& o) const {
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  return mesh == o.mesh && spec == o.spec && sorted(partial) == sorted(o.partial);
}

}  // namespace px
