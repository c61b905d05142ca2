// A deliberate layering violation, compiled with the cpu layer's include path by the test
// layering_rejects_cpu_probe: the cpu backend may not include the oracle, so this must not compile.
#include "core/validate.hpp"    // allowed: found
#include "reference/dense.hpp"  // forbidden: not on the cpu layer's path
