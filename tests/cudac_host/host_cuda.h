// Just enough of CUDA to run tilegemm's CUDA C kernels on the CPU, for tests on machines
// without a GPU. It checks the kernels' index arithmetic, bounds and barriers, not speed:
//
// - every thread of a block is a std::thread, and __syncthreads() is a std::barrier, so a
//   thread that leaves the kernel before a barrier its block still waits at hangs the run
//   (the test's timeout turns that into a failure), as it is undefined behaviour on a GPU;
// - blocks run one after another, so a __shared__ array can be a function-level static;
// - built with AddressSanitizer, so a read or write outside A, B, C or a shared array
//   stops the run with a report.
//
// The standard headers come first: the kernels' parameters are macros (TILE, R, BM...).
#pragma once
#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline std::barrier<>* block_barrier = nullptr;

inline void __syncthreads() { block_barrier->arrive_and_wait(); }
using std::min;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
