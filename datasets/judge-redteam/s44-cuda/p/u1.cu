extern "C" __global__ void k(float* y, const float* x) { int i = threadIdx.x; y[i] = __fdivide\u0066(x[i], x[i+1]); }
