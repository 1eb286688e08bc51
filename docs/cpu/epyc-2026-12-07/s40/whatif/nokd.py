# What-if: rescore every multi-process run of the given passes with validate's dispatch stretch
# (dispatch_stretch: the dispatch fit's host_share over the run's share) set to 1.
import sys, glob, os, shutil
from pathlib import Path
import earl.calibrate.validate as V
if os.environ.get("NOKD", "1") == "1":
    V.dispatch_stretch = lambda prof, nproc, device, share=None: 1.0
out_root = Path(sys.argv[1])
for src in sys.argv[2:]:
    src = Path(src)
    dst = out_root / src.name
    dst.mkdir(parents=True, exist_ok=True)
    for r in sorted(glob.glob(str(src / "*nproc*"))):
        r = Path(r)
        if not r.is_dir() or not (r / "runs").exists():
            continue
        o = dst / r.name
        if o.exists():
            shutil.rmtree(o)
        import contextlib, io
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            V.rescore_validation(source=r, profile=str(src / "profile-cpu.json"), out_dir=o)
    print("done", src.name, flush=True)
