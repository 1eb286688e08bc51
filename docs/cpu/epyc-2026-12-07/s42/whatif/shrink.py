import json,glob,numpy as np,statistics as st,sys
from collections import defaultdict
def cal_var(p):
    bp=p["fit_quality"]["host_probe"]["by_phase"]
    meds=[];noise=[]
    for k,v in bp.items():
        if len(v)<5: continue
        l=np.log(v); meds.append(np.median(l)); noise.append((np.pi/2)*np.var(l)/len(l))
    return max(0.0,np.var(meds)-np.mean(noise)), np.var(meds), len(meds)
def run_noise(r):
    t=json.load(open(r+"/runs/base/trace.json")); ev=t["traceEvents"] if isinstance(t,dict) else t
    x=[e["args"]["probe_s"] for e in ev if e.get("name")=="host_probe" and e.get("args",{}).get("probe_s")]
    l=np.log(x); return (np.pi/2)*np.var(l)/len(l), len(l)
for lab,pat,src in (("epyc","/work/main/docs/cpu/epyc-2026-12-07/cf1[5-8]?",None),("xeon","/tmp/s40/xeon_src/cf1*",None)):
    ws=[]
    for d in sorted(glob.glob(pat)):
        p=json.load(open(d+"/profile-cpu.json")); vt,vm,n=cal_var(p)
        for r in sorted(glob.glob(d+"/*nproc*")):
            if r.endswith(".log") or not glob.glob(r+"/runs/base/trace.json"): continue
            vn,m=run_noise(r); ws.append(vt/(vt+vn) if vt+vn>0 else 0)
        print(lab, d.split("/")[-1], "cal sd between phases %.3f (true %.3f, %d phases)"%(vm**.5, vt**.5, n), "run noise sd %.3f"%vn**.5)
    print(lab,"w median %.2f q10-90 %.2f-%.2f"%(np.median(ws),*np.percentile(ws,[10,90])))
