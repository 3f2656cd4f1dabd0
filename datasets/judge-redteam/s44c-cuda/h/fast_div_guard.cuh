// agent-written header that pcpp does read: its own conditional is never marked
#ifdef __PCPP__
__device__ __forceinline__ float fx(float v, float m) { return exp2f((v - m) * 1.4426950408889634f); }
#else
__device__ __forceinline__ float fx(float v, float m) { return __fdividef(1.f, __expf(m - v)); }
#endif
