#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
int main(){
  const int M=2048,N=1024; std::vector<float> x(M*N), w(N), out(M*N);
  for(auto&v:x) v = (rand()/(float)RAND_MAX)*2-1;
  for(int pass=0;pass<2;pass++){
    for(int i=0;i<N;i++) w[i] = pass? ldexpf(1.f, -126 + (rand()%12) - 6) * ((rand()&1)?1:-1) : 0.5f + rand()/(float)RAND_MAX;
    double best=1e9;
    for(int rep=0;rep<20;rep++){
      auto t0=std::chrono::steady_clock::now();
      for(int r=0;r<M;r++){ const float* xr=&x[r*N]; float s=0; for(int i=0;i<N;i++) s+=xr[i]*xr[i];
        float sc=1.f/std::sqrt(s/N+1e-6f); float* o=&out[r*N]; for(int k=0;k<N;k++) o[k]=xr[k]*sc*w[k]; }
      double t=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count(); if(t<best)best=t;}
    printf("pass %d (%s w): %.3f ms  out[5]=%g\n", pass, pass?"tiny":"positive", best*1e3, out[5]);
  }
}
