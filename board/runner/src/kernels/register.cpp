// Registers etlab's operators with ExecuTorch's kernel registry at static initialisation. This file is compiled
// into every executable that needs them (an object library, never a static archive, whose unreferenced object
// would be dropped by the linker with its initialiser).
#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>

#include "etlab_ops.h"

EXECUTORCH_LIBRARY(etlab, "update_cache.out", etlab::kernels::update_cache_out);
EXECUTORCH_LIBRARY(etlab, "attend.out", etlab::kernels::attend_out);
EXECUTORCH_LIBRARY(etlab, "rope.out", etlab::kernels::rope_out);
EXECUTORCH_LIBRARY(etlab, "rms_norm.out", etlab::kernels::rms_norm_out);
EXECUTORCH_LIBRARY(etlab, "shared_head.out", etlab::kernels::shared_head_out);
