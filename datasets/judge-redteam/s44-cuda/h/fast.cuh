// an agent-written header: CUDA's fast intrinsics behind names no rule lists
__device__ __forceinline__ float pipe_q(float a, float b) { return __fdividef(a, b); }
__device__ __forceinline__ float pipe_e(float d) { return __expf(d); }
