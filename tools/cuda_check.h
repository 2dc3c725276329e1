// CK(call) for the standalone probes under tools/ (load_rate.cu, wgmma_rate.cu): a failed CUDA runtime call
// prints its error and place and returns 1 from the calling function.
#pragma once

#include <cstdio>

#include <cuda_runtime.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)
