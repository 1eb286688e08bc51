import sys
from earl.cost_model.profile import load_profile
from earl.calibrate.host import local_cost_model
import sys; sys.path.insert(0, __import__('os').path.dirname(__file__)); import stag
from earl.cost_model.dispatch import price_transfer_plan
prof = load_profile(sys.argv[1]); world, per, ctx, lead = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
cm = local_cost_model(prof, world)
stag.LAYOUT = sys.argv[6] if len(sys.argv) > 6 else "runtime"
tp = stag.runtime_plans(world, per, ctx)["layout-aware"]
for control in (False, True):
    e = price_transfer_plan(cm, tp, samples=world * per, producers=world, world=world, control=control, lead_s=lead / 1e3)
    print("control", control, "total %.2f ms" % (e.time_s * 1e3), {k: round(v * 1e3, 2) for k, v in e.breakdown.items()})
