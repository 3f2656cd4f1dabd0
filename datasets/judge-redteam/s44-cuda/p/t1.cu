#include <cuda/../thrust/reduce.h>
#include <cuda/../thrust/execution_policy.h>
namespace th = thrust;
extern "C" __global__ void k(float* y, const float* x) { int i = threadIdx.x; y[i] = th::reduce(th::seq, x + i, x + i + 8, 0.f); }
