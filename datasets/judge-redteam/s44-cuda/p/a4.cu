extern "C" __device__ float __nv_frcp_rn(float);
extern "C" __device__ float __nv_fast_expf(float);
extern "C" __global__ void k(float* y, const float* x) { int i = threadIdx.x; y[i] = __nvvm_div_full(x[i], x[i+1]); }
