# The shipped-profile question (forty-second session): each pass's multi-process runs re-priced by
# PROFILE=loo (the median of the other passes' calibrations, earl.calibrate.merge), =own, or a path.
# usage: python loo.py OUTROOT PASS_DIRS...    (all passes given form the pool of the leave-one-out)
import contextlib, io, json, os, shutil, sys
from pathlib import Path
import earl.calibrate.validate as V
from earl.calibrate.merge import merge_profile_files
which = os.environ.get("PROFILE", "loo")
out = Path(sys.argv[1]); passes = [Path(p) for p in sys.argv[2:]]
pool = [Path(os.environ["POOL"]) / p.name for p in passes] if os.environ.get("POOL") else passes
only = os.environ.get("ONLY")
for i, src in enumerate(passes):
    if only and src.name not in only.split(","):
        continue
    dst = out / src.name; dst.mkdir(parents=True, exist_ok=True)
    if which == "loo":
        others = [str(p / "profile-cpu.json") for j, p in enumerate(pool) if j != i]
        prof = dst / "profile-loo.json"
        with contextlib.redirect_stdout(io.StringIO()):
            merge_profile_files(others, str(prof), force=True)
    elif which == "own":
        prof = src / "profile-cpu.json"
    else:
        prof = Path(which)
    quiet = (contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()))
    runs = [r for r in sorted(src.glob("*nproc*")) if r.is_dir() and (r / "runs").exists()]
    for r in runs:
        shutil.rmtree(dst / r.name, ignore_errors=True)
        with quiet[0], quiet[1]:
            V.rescore_validation(source=r, profile=str(prof), out_dir=dst / r.name)
    print("done", src.name, flush=True)
