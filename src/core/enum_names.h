// The names of an enum's values as one table in the enumerators' order (0, 1, 2, ...): the enum's
// name function and its parser read the same table. Each table sits beside its enum's name
// function, with a static_assert that it has one entry per enumerator.
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <string_view>

namespace px {

template <class E, size_t N>
const char* enum_name(E e, const char* const (&names)[N], const char* unknown = "?") {
  const auto i = static_cast<size_t>(e);
  return i < N ? names[i] : unknown;
}

template <class E, size_t N>
std::optional<E> enum_from_name(std::string_view name, const char* const (&names)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

}  // namespace px
