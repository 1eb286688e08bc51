import json, os, glob
from pathlib import Path
from earl.specs import MODEL_CATALOG
from earl.runtime.hf_model import hf_config_from_spec
root = Path("/work/main/docs/cpu/xeon-2026-12-07")
out = Path("/tmp/s40/xeon_src")
cfgd = hf_config_from_spec(MODEL_CATALOG["qwen2-27m"], "fp32")
for p in sorted((root / "rescored-38").glob("cf1*")):
    src = root / p.name
    dst = out / p.name
    dst.mkdir(parents=True, exist_ok=True)
    prof = json.loads((src / "profile-cpu.json").read_text())
    prof["train_lead_s"] = 0.271e-3; prof["train_lead_tensor_s"] = 9.84e-6
    (dst / "profile-cpu.json").write_text(json.dumps(prof))
    for r in sorted(src.glob("*nproc*")):
        if not r.is_dir():
            continue
        d = dst / r.name; d.mkdir(exist_ok=True)
        for f in ("runs", "validation.json", "validation.csv"):
            if not (d / f).exists():
                os.symlink(r / f, d / f)
        if r.name.startswith("heldout"):
            (d / "model").mkdir(exist_ok=True)
            c = cfgd.to_dict() if hasattr(cfgd, "to_dict") else cfgd
            (d / "model" / "config.json").write_text(json.dumps(c))
print("staged", len(list(out.glob("cf1*"))))
