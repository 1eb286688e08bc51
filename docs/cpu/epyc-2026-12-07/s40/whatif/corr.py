import json,sys,glob,csv,statistics as st
import numpy as np
from collections import defaultdict
rows=[]
for d in sorted(glob.glob(sys.argv[1])):
    pred={}
    for r in csv.DictReader(open(d+'/validation.csv')):
        if r['stage']=='dispatch': pred[int(r['step'])]=(float(r['measured_s'])*1e3,float(r['predicted_s'])*1e3)
    t=json.load(open(d+'/runs/base/trace.json'))
    ev=[e for e in t['traceEvents'] if e.get('ph')=='X']
    by=defaultdict(list); lp=defaultdict(list)
    for e in ev:
        if e['name']=='layout-aware': by[e['args']['step']].append(e)
    steps=sorted(by)
    sc=[s for s in steps if s>=1]
    for i,s in enumerate(sc):
        if i not in pred: continue
        es=by[s]; starts=sorted(e['ts'] for e in es)
        last=max(es,key=lambda e:e['ts']); end=max(e['ts']+e['dur'] for e in es)
        m,p=pred[i]
        rows.append((m,p,(starts[-1]-starts[-2])/1e3,(starts[-1]-starts[0])/1e3,last['dur']/1e3,(end-last['ts']-last['dur'])/1e3, last['args']['thread_cpu_s']*1e3, sum(e['args']['thread_cpu_s'] for e in es)*1e3/4))
a=np.array(rows)
print('n',len(a),'median meas %.2f pred %.2f'%(np.median(a[:,0]),np.median(a[:,1])))
res=a[:,0]-a[:,1]
for j,name in [(2,'gap2'),(3,'spread'),(4,'lastdur'),(5,'tail'),(6,'lastcpu'),(7,'meancpu')]:
    print(name,'median %.2f corr with resid %.2f'%(np.median(a[:,j]),np.corrcoef(a[:,j],res)[0,1]))
# bins by gap2
for lo,hi in [(0,0.5),(0.5,1),(1,2),(2,5),(5,100)]:
    m=(a[:,2]>=lo)&(a[:,2]<hi)
    if m.sum(): print('gap2 %g-%g n %d meas %.2f pred %.2f ratio %.2f'%(lo,hi,m.sum(),np.median(a[m,0]),np.median(a[m,1]),np.median(a[m,1]/a[m,0])))
