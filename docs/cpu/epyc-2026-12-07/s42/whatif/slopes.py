# Per stage and configuration: log(measured / predicted) against log(the run's host-probe factor) over
# the recorded passes (as recorded): correlation r, slope b, and the sd of the log ratio.
# usage (in docs/cpu/epyc-2026-12-07): python s42/whatif/slopes.py . 'cf1[5-8]?'
import json,glob,numpy as np,sys
root=sys.argv[1] if len(sys.argv)>1 else '.'
pat=sys.argv[2] if len(sys.argv)>2 else 'cf1[5-8]*'
for pre in ['nproc2-calc','nproc4-calc','heldout-nproc2','heldout-nproc4']:
  rows=[]
  for f in sorted(glob.glob(f'{root}/{pat}/{pre}*/validation.json')):
    d=json.load(open(f)); v=d['variants'][0]
    if not v.get('host_speed'): continue
    st={s['stage']:s['measured_s']/s['predicted_s'] for s in d['stages']}
    rows.append((v['host_speed'],st))
  if not rows: continue
  hs=np.log([r[0] for r in rows])
  out=[pre,len(rows)]
  for s in ['rollout','experience','dispatch','train','reshard']:
    y=np.log([r[1][s] for r in rows])
    c=np.corrcoef(hs,y)[0,1]; sl=np.polyfit(hs,y,1)[0]
    out.append(f'{s[:4]} r={c:.2f} b={sl:.2f} sd={y.std():.2f}')
  print(*out)
