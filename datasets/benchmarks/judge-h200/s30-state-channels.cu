// GPU probe (not run: no device lent). Does state kept in a function-scope asm `.global`
// persist across launches? Does shared address 0 (computed, not %reserved_smem_*) keep a mark?
// Does a store through cvta.const change __constant__ memory?  nvcc -arch=sm_90a -o s s.cu && ./s
#include <cstdio>
__constant__ unsigned cst[4];
__global__ void k(unsigned* o){
 unsigned c; asm volatile("{ .global .align 4 .u32 st; atom.global.add.u32 %0,[st],1; }":"=r"(c));
 unsigned z=0,r; asm volatile("ld.shared.u32 %0,[%1];":"=r"(r):"r"(z)); asm volatile("st.shared.u32 [%0],%1;"::"r"(z),"r"(0xabc0u+c));
 unsigned rb,re; asm("mov.u32 %0,%%reserved_smem_offset_begin;":"=r"(rb)); asm("mov.u32 %0,%%reserved_smem_offset_end;":"=r"(re));
 if(threadIdx.x==0&&blockIdx.x==0){o[0]=c;o[1]=r;o[2]=rb;o[3]=re;}
}
__global__ void cw(unsigned* o){unsigned* p; asm("cvta.const.u64 %0, cst;":"=l"(p)); if(threadIdx.x==0){o[4]=p[0]; p[0]=p[0]+1;}}
__global__ void other(float* x){__shared__ float s[2048]; for(int i=threadIdx.x;i<2048;i+=blockDim.x) s[i]=1.f; __syncthreads(); x[threadIdx.x]=s[threadIdx.x];}
int main(){unsigned*o; float*x; cudaMalloc(&o,64); cudaMalloc(&x,4096*4); unsigned h[5];
 for(int i=0;i<4;i++){ k<<<1,32>>>(o); other<<<132,256>>>(x); cw<<<1,32>>>(o); cudaError_t e=cudaDeviceSynchronize(); cudaMemcpy(h,o,20,cudaMemcpyDeviceToHost);
  printf("launch %d: err=%s asm-global counter=%u smem[0]=0x%x reserved=[%u,%u) const=%u\n",i,cudaGetErrorString(e),h[0],h[1],h[2],h[3],h[4]);}
}
