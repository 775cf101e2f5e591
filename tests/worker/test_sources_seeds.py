"""Per-source seeds (steady.worker.contract.sources): a pinned source stays put, a varied one moves, and the
built-in sources model really varies only what its arm says (the seeds control the output)."""
from __future__ import annotations

import json
from typing import get_args

import pytest
from pydantic import ValidationError

from steady.server.studies.schemas import StudySpec
from steady.server.studies.spec_parts import SourceName
from steady.worker.contract import placeholders
from steady.worker.contract.sources import SOURCES, SourcesError, placeholder_values, seed_for
from steady.worker.inrun import sdk


def test_pinned_sources_stay_put_and_varied_ones_move():
    params = {"sources": "init"}
    a, b = ({s: seed_for(s, seed=k, params=params) for s in SOURCES} for k in (1, 2))
    assert a["init"] != b["init"]
    assert a["data"] == b["data"] and a["dropout"] == b["dropout"] and a["numerics"] == b["numerics"]
    assert a["ulp"] is None and b["ulp"] is None  # not varied: nothing perturbed
    every = {s: seed_for(s, seed=1, params={"sources": "all"}) for s in SOURCES}
    assert every["ulp"] is not None and len(set(every.values())) == len(SOURCES)
    # an ordinary study (no 'sources'): every source follows the run's seed, no weight is perturbed
    assert seed_for("data", seed=1, params={}) != seed_for("data", seed=2, params={})
    assert seed_for("ulp", seed=1, params={}) is None


def test_crossed_grid_seeds():
    p = {"sources": "init,data", "crossed": 3}
    init = [seed_for("init", seed=s, params=p) for s in range(9)]
    data = [seed_for("data", seed=s, params=p) for s in range(9)]
    assert len(set(init)) == 3 and len(set(data)) == 3
    assert init[0] == init[2] != init[3] and data[0] == data[3] != data[1]


def test_placeholders_fill_a_command():
    values = {"seed": 4, **placeholder_values(seed=4, params={"sources": "data"})}
    argv = [placeholders.fill(a, values) for a in ["--init", "{init_seed}", "--data", "{data_seed}", "--ulp={ulp_seed}"]]
    assert argv[1] == str(seed_for("init", seed=4, params={"sources": "data"}))
    assert argv[3] == str(seed_for("data", seed=4, params={"sources": "data"})) and argv[4] == "--ulp=-1"
    with pytest.raises(SourcesError, match="unknown source"):
        placeholder_values(seed=1, params={"sources": "init,kernels"})


def _run_sources(tmp_path, arm: str, seed: int, model: str = "torch_sources") -> dict:
    from steady.worker.inrun.workloads import load

    ctx = sdk.RunContext(seed=seed, determinism="seeded", framework="torch" if model.startswith("torch") else "python",
                         threads=1, params={"sources": arm, "epochs": 1, "eval_every": 1000})
    events = tmp_path / f"{model}-{arm}-{seed}.jsonl"
    run = sdk._start(ctx, str(events))
    sdk._exposed.clear()
    try:
        load(model).run(ctx)
    finally:  # this process is a test worker: later tests must find no active run (sdk.context() is None)
        sdk._run = None
        sdk._exposed.clear()
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    exposed = [e["value"]["sources_exposed"] for e in lines if e.get("e") == "info" and "sources_exposed" in e["value"]]
    return {"digests": dict(run.digests), "loss": run.last["val_loss"], "exposed": exposed[-1]}


@pytest.mark.parametrize("model", ["torch_sources", "numpy_sources"])
def test_the_builtin_model_varies_only_its_arms_source(tmp_path, model):
    def _run(arm: str, seed: int) -> dict:
        return _run_sources(tmp_path, arm, seed, model)

    init = [_run("init", s) for s in (0, 1)]
    data = [_run("data", s) for s in (0, 1)]
    assert init[0]["digests"]["initial_weights"] != init[1]["digests"]["initial_weights"]
    assert init[0]["digests"]["data_order"] == init[1]["digests"]["data_order"]
    assert data[0]["digests"]["initial_weights"] == data[1]["digests"]["initial_weights"]
    assert data[0]["digests"]["data_order"] != data[1]["digests"]["data_order"]
    none = [_run("none", s) for s in (0, 1)]
    assert none[0]["loss"] == none[1]["loss"]  # everything pinned: the twin is reproducible on a CPU
    numerics = [_run("numerics", s) for s in (0, 1)]  # the same sums in another order: other last bits
    assert numerics[0]["digests"]["data_order"] == none[0]["digests"]["data_order"]
    assert numerics[0]["digests"]["final_weights"] != numerics[1]["digests"]["final_weights"]
    ulp = _run("ulp", 0)
    assert ulp["digests"]["initial_weights"] != none[0]["digests"]["initial_weights"]  # one weight, one ULP
    assert sorted(ulp["exposed"]) == sorted(SOURCES)  # the model reads every source's seed


def _spec(**extra):
    return {"name": "s", "workload": {"framework": "torch", "name": "torch_sources"}, "seeds": [0, 1, 2], **extra}


def test_a_sources_spec_writes_its_arms_and_refuses_bad_input_by_field():
    spec = StudySpec.model_validate(_spec(sources={"vary": ["init", "data"], "crossed": 2}))
    assert [a.name for a in spec.arms] == ["none", "init", "data", "all", "init_x_data"]
    assert StudySpec.model_validate(spec.model_dump(mode="json")).arms == spec.arms  # read back unchanged
    assert set(get_args(SourceName)) == set(SOURCES)  # the spec's names are the worker's
    cases = [
        (_spec(sources={"vary": ["init", "kernels"]}), ("sources", "vary", 1)),
        (_spec(sources={"vary": ["init"]}), ("sources", "vary")),
        (_spec(sources={"crossed": 1}), ("sources", "crossed")),
        (_spec(sources={}, arms=[{"name": "a"}, {"name": "b", "params": {"lr": 1}}]), ("arms",)),
        (_spec(sources={}, workload={"framework": "torch", "name": "torch_sources", "params": {"sources": "init"}}),
         ("workload", "params", "sources")),
    ]
    for body, loc in cases:
        with pytest.raises(ValidationError) as exc:
            StudySpec.model_validate(body)
        assert any(tuple(e["loc"]) == loc for e in exc.value.errors()), (loc, exc.value.errors())


def test_the_sources_demo_spec_is_a_full_grid_and_a_repeat_draws_fresh_seeds():
    from steady.server.cli.demo.run import sources_spec

    first, again = StudySpec.model_validate(sources_spec(64)), StudySpec.model_validate(sources_spec(64, first_seed=1000))
    assert first.run_count == 8 * 64 and [a.name for a in first.arms][-1] == "init_x_data"
    assert not set(first.seeds) & set(again.seeds)
    for spec in (first, again):  # every (init, data) cell of the 8 × 8 grid once
        cells = {(s // 8, s % 8) for s in spec.seeds}
        assert len(cells) == 64 and len({i for i, _ in cells}) == 8 and len({j for _, j in cells}) == 8
    # the demo's default: 32 runs per arm and stage, up to 224 per arm (arms grow in stages)
    staged = StudySpec.model_validate(sources_spec(32, max_runs=224))
    assert staged.workload.name == "torch_sources"
    assert staged.budget is not None and (staged.budget.max_seeds, staged.budget.stage_seeds) == (224, 32)
    assert StudySpec.model_validate(sources_spec(32, max_runs=32)).budget is None  # one fixed stage
    twin = StudySpec.model_validate(sources_spec(32, numpy=True))
    assert twin.workload.name == "numpy_sources" and twin.workload.framework.value == "python"


def test_the_sources_demo_command_line_reaches_the_spec():
    """The options the docs' repeated runs use parse (``--first-seed`` had once fallen out of the parser while the
    demo still read it) and give the staged default: 32 runs per stage, at most 224 per arm, fresh seeds."""
    from steady.server.cli import build_parser
    from steady.server.cli.demo.run import sources_spec

    args = build_parser().parse_args(["demo", "--sources", "--exit", "--numpy", "--first-seed", "1000"])
    assert (args.runs, args.max_runs, args.first_seed, args.numpy) == (32, 224, 1000, True)
    spec = StudySpec.model_validate(sources_spec(args.runs, first_seed=args.first_seed, max_runs=args.max_runs,
                                                 numpy=args.numpy))
    assert min(spec.seeds) == 1000 and spec.budget is not None and spec.budget.max_seeds == 224
    assert build_parser().parse_args(["demo", "--sources"]).first_seed == 0
    # the time budget: 27 minutes unless told (0: none), so the table is printed within 30
    for argv, minutes in ((["demo", "--sources"], 27.0), (["demo", "--sources", "--minutes", "10"], 10.0),
                          (["demo", "--sources", "--minutes", "0"], None)):
        args = build_parser().parse_args(argv)
        spec = StudySpec.model_validate(sources_spec(args.runs, max_runs=args.max_runs, minutes=args.minutes))
        assert spec.budget is not None and spec.budget.max_minutes == minutes, argv


def test_the_numpy_model_s_gradient_is_torch_autograd_s():
    """numpy_sources writes its backward pass by hand: it matches PyTorch's autograd on the same weights, batch
    and dropout mask (float32, to rounding)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from steady.worker.inrun.workloads.numpy_sources import init_params, loss_and_grads

    rng = np.random.default_rng(7)
    p = init_params(16, rng)
    x = rng.random((12, 64), dtype=np.float32)
    y = rng.integers(0, 10, 12)
    mask = (rng.random((12, 16)) >= 0.2).astype(np.float32) / np.float32(0.8)
    loss, grads = loss_and_grads({k: v.copy() for k, v in p.items()}, x, y, mask)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    h = F.relu(torch.from_numpy(x) @ t["w1"].T + t["b1"]) * torch.from_numpy(mask)
    ref = F.cross_entropy(h @ t["w2"].T + t["b2"], torch.from_numpy(y))
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-5)
    for k in ("w1", "b1", "w2", "b2"):
        assert grads[k].dtype == np.float32
        np.testing.assert_allclose(grads[k], t[k].grad.numpy(), rtol=1e-4, atol=1e-6)
