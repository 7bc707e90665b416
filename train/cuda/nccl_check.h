// train/cuda/nccl_check.h: a failed NCCL call as a library failure (exec/cuda/cuda_check.h's
// form), naming the call and NCCL's own text.
#pragma once

#include <nccl.h>

#include "exec/cuda/cuda_check.h"

#define PT_NCCL_CHECK(call)                                                                           \
  do {                                                                                                \
    const ncclResult_t pt_status_ = (call);                                                           \
    if (pt_status_ != ncclSuccess)                                                                    \
      ::pt::cuda::library_failure("NCCL", __FILE__, __LINE__, #call, ncclGetErrorString(pt_status_)); \
  } while (0)
