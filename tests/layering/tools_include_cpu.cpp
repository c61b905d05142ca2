// A deliberate layering violation, compiled with the CLI's include path by the test
// layering_rejects_tools_probe: tools reach backends only through the Backend interface.
#include "conformance/conformance.hpp"  // allowed: found
#include "cpu/kernels.hpp"              // forbidden: not on the CLI's path
