// Sizing ExecuTorch's shared thread pool (used by XNNPACK and the optimized kernels).
#pragma once

#include <cstddef>

namespace etlab {

// Resizes the pool; must run before any method is loaded, because XNNPACK keeps the pthreadpool
// pointer it was initialised with. Returns the pool's thread count afterwards.
size_t set_thread_count(size_t threads);

}  // namespace etlab
