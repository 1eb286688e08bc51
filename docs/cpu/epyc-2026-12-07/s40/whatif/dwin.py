import json,sys,statistics as st, glob
from collections import defaultdict
def stats(f):
    t=json.load(open(f)); ev=[e for e in t['traceEvents'] if e.get('ph')=='X' and e['name']=='layout-aware' and e['args']['step']>=1]
    by=defaultdict(list)
    for e in ev: by[e['args']['step']].append(e)
    W=[];D=[];T=[];LS=[];CPU=[]
    for s,es in by.items():
        if len(es)<4: continue
        last=max(es,key=lambda e:e['ts'])
        end=max(e['ts']+e['dur'] for e in es)
        w=(end-last['ts'])/1e3; d=last['dur']/1e3
        W.append(w); D.append(d); T.append(w-d)
        ends=sorted(e['ts']+e['dur'] for e in es)
        # lateness of last starter relative to second to last start
        starts=sorted(e['ts'] for e in es)
        LS.append((starts[-1]-starts[-2])/1e3)
        CPU.append(last['args']['thread_cpu_s']*1e3)
    return W,D,T,LS,CPU
pat=sys.argv[1]
allW=[];allD=[];allT=[];allC=[]
for f in sorted(glob.glob(pat)):
    W,D,T,LS,C=stats(f)
    allW+=W;allD+=D;allT+=T;allC+=C
    print(f.split('/')[0], f.split('/')[1][:14], 'window %.2f lastdur %.2f tail %.2f lastcpu %.2f gap2 %.2f n=%d'%(st.median(W),st.median(D),st.median(T),st.median(C),st.median(LS),len(W)))
print('ALL window %.2f lastdur %.2f tail %.2f lastcpu %.2f; tail>0.3 in %d of %d'%(st.median(allW),st.median(allD),st.median(allT),st.median(allC),sum(t>0.3 for t in allT),len(allT)))
