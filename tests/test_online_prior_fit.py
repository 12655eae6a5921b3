"""The online prior's method-of-moments fit recovers the parts it was drawn from."""
from __future__ import annotations

import math

import numpy as np
import pytest

from estimators.evaluation.online_prior import Point, fit_prior_to_points
from instances.grid import Grid, Shape

TRUE = {"job": 0.05, "type": 0.15, "shape": 0.08, "shared_shape": 0.15, "shared_family": 0.06, "shared_model": 0.16}


def _draw(seed: int) -> list[Point]:
    """Log errors drawn from the kernel (communication share 0): 3 families x 4 models x
    5 batches, each job on 8 of 12 shapes over 2 GPU types."""
    rng = np.random.default_rng(seed)
    shapes = [Shape(t, n, g) for t in ("a100", "v100") for n in (1, 2) for g in (1, 2, 4)]
    shape_eff = {s: rng.normal(0, TRUE["shared_shape"]) for s in shapes}
    fam_eff, model_eff = {}, {}
    pts = []
    for f in ("gpt", "moe", "wide_resnet"):
        for m in range(4):
            model = f"{f}__{m}"
            for batch in (32, 64, 128, 256, 512):
                job = rng.normal(0, TRUE["job"])
                typ = {t: rng.normal(0, TRUE["type"]) for t in sorted({s.gpu_type for s in shapes})}
                for k in rng.choice(len(shapes), 8, replace=False):
                    s = shapes[k]
                    fe = fam_eff.setdefault((f, s), rng.normal(0, TRUE["shared_family"]))
                    me = model_eff.setdefault((model, s), rng.normal(0, TRUE["shared_model"]))
                    x = job + typ[s.gpu_type] + rng.normal(0, TRUE["shape"]) + shape_eff[s] + fe + me
                    pts.append(Point(model, batch, f, Grid(s, 1), x, 0.0))
    return pts


def test_joint_fit_recovers_the_parts_and_the_own_only_fit_folds_them_into_shape():
    fits = [fit_prior_to_points(_draw(seed))[0] for seed in range(12)]
    for part, want in TRUE.items():
        got = float(np.sqrt(np.mean([getattr(f, part) ** 2 for f in fits])))   # rms over draws
        assert got == pytest.approx(want, abs=0.03), part
    own = [fit_prior_to_points(_draw(seed), cross_job=False)[0] for seed in range(8)]
    assert all(o.shared_shape == o.shared_family == o.shared_model == 0 for o in own)
    folded = math.sqrt(sum(TRUE[p] ** 2 for p in ("shape", "shared_shape", "shared_family", "shared_model")))
    assert float(np.sqrt(np.mean([o.shape ** 2 for o in own]))) == pytest.approx(folded, abs=0.05)
