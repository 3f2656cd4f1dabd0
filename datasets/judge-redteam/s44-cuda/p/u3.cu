extern "C" __global__ void k(float* y, const float* x) { int i = threadIdx.x; int q = __float2int_rn(x[i]*127.f); q = max(-127, min(127, q)); y[i] = (float)(signed char)q * (1.f/127.f); }
