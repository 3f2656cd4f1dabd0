#include <immintrin.h>
#include <pthread.h>
#include <atomic>
#include <thread>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <algorithm>
alignas(64) static uint16_t y[3072*4];
alignas(64) static uint16_t x[40000];
std::atomic<int> phase{0};
static inline uint64_t lat(const volatile uint16_t* p){ _mm_lfence(); uint64_t t0=__rdtsc(); _mm_lfence(); (void)*p; _mm_lfence(); uint64_t t1=__rdtsc(); return t1-t0;}
void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
int main(){
  std::thread judge([]{ pin(0); for(int it=0;it<20;it++){ while(phase.load()!=1){} 
      if(it%2==0){ for(int i=0;i<3072;i++) y[i]=i; } else { volatile int s=0; for(int i=0;i<3072;i+=3) s+=y[i]; for(int i=0;i<40000;i++) x[i]=i+it; }
      phase.store(2);} });
  pin(1);
  for(int it=0;it<20;it++){
    for(int i=0;i<3072;i++) y[i]=i*7;  // kernel writes own output
    phase.store(1); while(phase.load()!=2){}
    volatile uint16_t loc=1; uint64_t b=1e9; for(int k=0;k<5;k++) b=std::min(b,lat(&loc));
    uint64_t l[8]; for(int k=0;k<8;k++) l[k]=lat(y+ (k*3072/8));
    std::sort(l,l+8);
    printf("%s base %lu  lat sorted:", it%2==0?"DECOY":"TIMED", b); for(int k=0;k<8;k++) printf(" %lu",l[k]); printf("\n");
    phase.store(0);
  }
  judge.join();
}
