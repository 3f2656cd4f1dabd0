"""Session 23: fit the split-count model waves(ns) * (tokens a split + C) + S * [ns > 1] to the
decode run's own times at its grid points (NW 8 unless told, VEC 8, STAGES 2), and print the
best (C, S) by the mean regret of the model's pick among the measured options.

    python datasets/benchmarks/attention-h200/s23-split-fit.py [NW]

Run from the repo root. See notebook/kernels.md, "A model for the split count"."""
import csv, math, json, sqlite3, sys
rows=list(csv.DictReader(open('datasets/benchmarks/attention-h200/s23-range-trials.tsv'),delimiter='\t'))
byid={int(r['id']):r for r in rows}
c=sqlite3.connect('datasets/benchmarks/attention-h200/s23-run/ledger.db')
params={r[0]:json.loads(r[1]) for r in c.execute("select id,params from trials")}
cols=[k for k in rows[0] if k.startswith('t_us[')]
NW=int(sys.argv[1]) if len(sys.argv)>1 else 8
sel={tid:p for tid,p in params.items() if p['NW']==NW and p['VEC']==8 and p['STAGES']==2 and byid[tid]['status']=='ok'}
def ns_of(p,B,L):
    if p['WAVES']==0: return math.ceil(L/p['SPLIT'])
    W=132; BH=B*8
    nsw=max(1,math.ceil(p['WAVES']*W/BH))
    nsf=min(128, math.ceil(L/128), (math.ceil(BH*nsw/W)*W)//BH)
    spl=math.ceil(math.ceil(L/nsf)/128)*128
    return math.ceil(L/spl)
def tok(ns,L): return math.ceil(math.ceil(L/ns)/128)*128
pts=[]
for col in cols:
    B,L=map(int,col[5:-1].split('x'))
    meas={}
    for tid,p in sel.items():
        v=byid[tid][col]
        if v:
            ns=ns_of(p,B,L)
            if ns<=128: meas[tid]=(float(v),ns,tok(ns,L))
    pts.append((B,L,meas))
res=[]
for C in [128,256,384,512,768,1024,1536]:
  for S in [0,128,256,384,512,768,1024,1536,2048]:
    regs=[]
    for B,L,meas in pts:
        cost=lambda ns,t: math.ceil(B*8*ns/132)*(t+C)+(S if ns>1 else 0)
        pick=min(meas, key=lambda k: cost(meas[k][1],meas[k][2]))
        best=min(v[0] for v in meas.values())
        regs.append(meas[pick][0]/best-1)
    regs.sort()
    res.append((sum(regs)/len(regs), regs[-1], C,S, sum(x<=0.03 for x in regs), regs[int(.9*len(regs))]))
res.sort()
for r in res[:8]: print('mean %.4f max %.3f C %d S %d within3%% %d/74 p90 %.3f'%r)
