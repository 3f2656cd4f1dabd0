// agent-written header, never read by the rules (no guard of any kind)
__device__ __forceinline__ float fx(float v, float m) { return __fdividef(1.f, __expf(m - v)); }
