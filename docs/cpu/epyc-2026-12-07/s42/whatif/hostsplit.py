# What-if (forty-second session): rescore recorded multi-process runs with the run's host-probe
# factor (validate's host_speed) applied to the profile's host-work constants only (per-op and
# per-step overheads, the fitted host terms, the dispatch path, the estimator, the gloo links),
# not to the compute rates (peak FLOP/s, memory bandwidth): SPLIT=host (default) or SPLIT=all
# (every constant, earl.cost_model.profile.slowed). ALPHA scales the factor's exponent (1).
# usage: python hostsplit.py OUTROOT SRC_PASS_DIRS...   (each with profile-cpu.json and *nproc* runs)
import contextlib, dataclasses, io, json, os, shutil, sys, tempfile
from pathlib import Path
import earl.calibrate.validate as V
from earl.cost_model.profile import HardwareProfile, load_profile, slowed

split = os.environ.get("SPLIT", "host")
alpha = float(os.environ.get("ALPHA", "1"))


def host_slowed(prof: HardwareProfile, k: float) -> HardwareProfile:
    s = slowed(prof, k)
    if split == "all":
        return s
    return dataclasses.replace(s, hardware=prof.hardware)  # compute rates as calibrated


out_root = Path(sys.argv[1])
for src in map(Path, sys.argv[2:]):
    prof = load_profile(src / "profile-cpu.json")
    for r in sorted(src.glob("*nproc*")):
        if not r.is_dir() or not (r / "runs").exists():
            continue
        k = json.loads((r / "validation.json").read_text())["variants"][0].get("host_speed") or 1.0
        o = out_root / src.name / r.name
        if o.exists():
            shutil.rmtree(o)
        with tempfile.TemporaryDirectory() as td:
            p = Path(td) / "profile-cpu.json"
            host_slowed(prof, k ** alpha).save(p)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                V.rescore_validation(source=r, profile=str(p), out_dir=o)
    print("done", src.name, flush=True)
