extern "C" __global__ void k(float* y, const float* x) { int i = threadIdx.x; y[i] = fdividef(x[i], x[i+1]); }
