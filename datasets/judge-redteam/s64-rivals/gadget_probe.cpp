#include <cstring>
#include <cstdio>
#include <cstdint>
static const unsigned char PAT[] = {0x48,0x89,0xf8,0x48,0x89,0xf7,0x48,0x89,0xd6,0x48,0x89,0xca,0x4d,0x89,0xc2,0x4d,0x89,0xc8,0x4c,0x8b,0x4c,0x24,0x08,0x0f,0x05};
int main(){
  void* (*volatile mc)(void*,const void*,size_t) = memcpy;
  const unsigned char* p=(const unsigned char*)mc;
  printf("memcpy at %p\n",p);
  FILE*f=fopen("/proc/self/maps","r"); char line[512];
  unsigned long lo=0,hi=0;
  while(fgets(line,512,f)){unsigned long a,b; char perm[8]; sscanf(line,"%lx-%lx %7s",&a,&b,perm); if((unsigned long)p>=a&&(unsigned long)p<b){lo=a;hi=b;printf("%s",line);} }
  for(unsigned long q=lo;q+sizeof(PAT)<hi;q++) if(!memcmp((void*)q,PAT,sizeof(PAT))) printf("pattern at %p, offset %ld from memcpy; mapping %lx-%lx (memcpy-lo=%ld hi-memcpy=%ld)\n",(void*)q,(long)(q-(unsigned long)p),lo,hi,(long)((unsigned long)p-lo),(long)(hi-(unsigned long)p));
}
