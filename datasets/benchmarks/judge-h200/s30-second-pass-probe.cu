// GPU probe: do .global variables declared in a way the PTX scan misses keep state across launches?
#include <cstdio>
__global__ void ml(unsigned* o){ unsigned c; asm volatile("{ .global\n.align 4 .u32 st_ml; atom.global.add.u32 %0,[st_ml],1; }":"=r"(c)); if(threadIdx.x==0&&blockIdx.x==0) o[0]=c; }
__global__ void ns(unsigned* o){ unsigned c; asm volatile("{ .global.u32 st_ns; atom.global.add.u32 %0,[st_ns],1; }":"=r"(c)); if(threadIdx.x==0&&blockIdx.x==0) o[1]=c; }
__global__ void other(float* x){__shared__ float s[2048]; for(int i=threadIdx.x;i<2048;i+=blockDim.x) s[i]=1.f; __syncthreads(); x[threadIdx.x]=s[threadIdx.x];}
int main(){unsigned*o; float*x; cudaMalloc(&o,64); cudaMalloc(&x,4096*4); unsigned h[2];
 for(int i=0;i<4;i++){ ml<<<1,32>>>(o); ns<<<1,32>>>(o); other<<<132,256>>>(x); cudaError_t e=cudaDeviceSynchronize(); cudaMemcpy(h,o,8,cudaMemcpyDeviceToHost);
  printf("launch %d: err=%s multiline-.global counter=%u nospace-.global counter=%u\n",i,cudaGetErrorString(e),h[0],h[1]);}
}
