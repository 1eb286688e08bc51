import json,sys,glob,statistics as st
from collections import defaultdict
P=defaultdict(list)
for f in sorted(glob.glob(sys.argv[1])):
    t=json.load(open(f)); ev=[e for e in t['traceEvents'] if e.get('ph')=='X' and e['name']=='layout-aware' and e['args']['step']>=1]
    by=defaultdict(list)
    for e in ev: by[e['args']['step']].append(e)
    for s,es in by.items():
        last=max(es,key=lambda e:e['ts']); fin=max(es,key=lambda e:e['ts']+e['dur'])
        a=last['args']; d=last['dur']/1e3
        P['last_plan'].append(d-a['moved_s']*1e3); P['last_adv'].append(a['advantage_s']*1e3); P['last_phase'].append(a['phase_s'][0]*1e3)
        P['last_cpu'].append(a['thread_cpu_s']*1e3)
        P['fin_is_last'].append(1.0 if fin is last else 0.0)
        P['window'].append((fin['ts']+fin['dur']-last['ts'])/1e3)
        others=[e for e in es if e is not last]
        P['other_plan'].append(st.median(e['dur']/1e3-e['args']['moved_s']*1e3 for e in others))
        P['other_adv'].append(st.median(e['args']['advantage_s']*1e3 for e in others))
print(sys.argv[1][:30], ' '.join('%s %.2f'%(k, st.median(v) if k!='fin_is_last' else sum(v)/len(v)) for k,v in P.items()))
