// The experiments that ship with pax (registered on the registry's first use).
#pragma once

namespace px::pax {
void register_builtin_experiments();
}
