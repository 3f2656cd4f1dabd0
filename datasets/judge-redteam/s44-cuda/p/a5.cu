extern "C" __global__ void k(float* y, const float* x) { int i = threadIdx.x; y[i] = __nvvm_sqrt_f(x[i]) + __nvvm_rcp_rn_f(x[i+1]); }
