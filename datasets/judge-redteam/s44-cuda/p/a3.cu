extern "C" __global__ void k(float* y, const float* x) { int i = threadIdx.x; y[i] = __fmul_rz(x[i], x[i+1]) + __fadd_rd(x[i], 1.f) + __frcp_rz(x[i+2]) + __fsqrt_ru(x[i+3]); }
