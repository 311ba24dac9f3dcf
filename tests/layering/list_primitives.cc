// Prints the name of every registered primitive, one per line, for scripts/check_primitive_names.py
// (--names-from): a primitive's name compared or listed outside src/ops is found however the
// comparison is spelt (a helper that returns the name, a set of names), not only `prim->name ==`.
#include <iostream>

#include "ir/primitive.h"
#include "sharding/prims.h"

int main() {
  px::ensure_sharding_registered();
  for (const std::string& name : px::primitive_names()) std::cout << name << "\n";
  return 0;
}
