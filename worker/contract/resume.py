"""The resume check's names and its judgement, framework-free (the agent, the run and the server read them).

A run with ``RunSpec.resume`` is started by the agent as ``python -m steady.worker.inrun.resume`` (the
driver), which starts the code once uninterrupted (the reference, the run's own metrics and result)
and then once per resume point, killed after it and restarted, each launch's checkpoints in
:data:`CHECKPOINT_ENV`. :func:`judge` compares what the launches recorded
(:mod:`steady.worker.inrun.resumestate`) and names the state the resumed run failed to restore.

Attribution follows the order in which one component explains another (:data:`COMPONENTS`): the
gradients of the first update after the resume point (``data``) depend on the parameters, the RNGs
and the loader seeds, so a difference there is put down to the data position only when all of those
match; a launch that made a different number of updates in all did not restore its step counter. With
several resume points, the first point where anything differs is the one attributed: what was missed
there changes everything after it.
"""

from __future__ import annotations

from typing import Any

DRIVER_MODULE = "steady.worker.inrun.resume"
PLAN_ENV = "STEADY_RESUME_PLAN"  # JSON: at, command (or None: the harness), placeholder values, python, run_dir
CHECKPOINT_ENV = "STEADY_CHECKPOINT_DIR"
ROLE_ENV = "STEADY_RESUME_ROLE"
AT_ENV = "STEADY_RESUME_AT"  # reference: comma-separated updates after which the state is digested
STOP_ENV = "STEADY_RESUME_STOP"  # interrupted: updates this process makes before it is killed
FROM_ENV = "STEADY_RESUME_FROM"  # a launch that resumes: the update it resumes after
OUT_ENV = "STEADY_RESUME_OUT"
SIGNAL_ENV = "STEADY_RESUME_SIGNAL"  # "kill" (default) or "term"
MICRO_ENV = "STEADY_RESUME_MICRO"  # mid-accumulation: backward passes of update k + 1 made before the stop
TERM_GRACE_S = 20.0  # after SIGTERM, a process that lives on this long is SIGKILLed

# what a launch digests at a resume point, per framework (a component a framework lacks is absent from both sides)
TORCH_COMPONENTS = ("parameters", "optimizer_state", "lr_scheduler", "grad_scaler", "python_rng", "numpy_rng", "torch_rng",
                    "loader_worker_seeds", "data")
# a stop between the micro-batches of one gradient-accumulation step (``resume.micro_batches``) adds two
ACCUMULATION_COMPONENTS = ("accumulated_gradients", "micro_batch_counter")
KERAS_COMPONENTS = ("parameters", "optimizer_state", "optimizer_iterations", "lr_scheduler", "python_rng", "numpy_rng",
                    "tf_rng", "data")
COMPONENTS = ("parameters", "optimizer_state", "optimizer_iterations", "lr_scheduler", "grad_scaler",
              "accumulated_gradients", "micro_batch_counter", "python_rng", "numpy_rng", "torch_rng", "tf_rng",
              "loader_worker_seeds", "data")
FRAMEWORKS = ("torch", "tensorflow")
STEP_COUNTER = "step_counter"
NO_CHECKPOINT = "checkpoint"  # the resumed launch started from the initial state: no checkpoint was loaded
# what a user reads in a report: the piece of state, as one would name it in a checkpoint
LABELS = {
    "parameters": "model parameters (weights)",
    "optimizer_state": "optimizer state (moments, per-parameter steps, hyperparameters)",
    "lr_scheduler": "LR scheduler state",
    "grad_scaler": "gradient scaler state (torch.amp.GradScaler: scale, growth tracker)",
    "accumulated_gradients": "accumulated gradients (the .grad of the micro-batches before the stop, in the middle "
                             "of a gradient-accumulation step)",
    "micro_batch_counter": "micro-batch counter (the resumed run's first update summed a different number of "
                           "micro-batches)",
    "python_rng": "Python RNG state (random.getstate)",
    "numpy_rng": "NumPy RNG state (np.random.get_state)",
    "torch_rng": "torch RNG state (torch.get_rng_state / CUDA)",
    "optimizer_iterations": "optimizer iterations (optimizer.iterations: the step of a Keras learning-rate schedule "
                            "and of Adam's bias correction)",
    "tf_rng": "TF RNG state (the Keras SeedGenerator states, e.g. Dropout's, and tf.random.Generator states)",
    "loader_worker_seeds": "DataLoader worker seeds (the loader's generator)",
    "data": "data position (the batch after the resume point)",
    STEP_COUNTER: "step counter (the resumed run made a different number of updates)",
    NO_CHECKPOINT: "checkpoint (the resumed run started from scratch, its weights and optimizer those before "
                   "update 1: nothing was saved after the resume step, or it was not found in {checkpoint_dir})",
}
# a difference in ``data`` is explained by any of these
_UPSTREAM_OF_DATA = ("parameters", "accumulated_gradients", "micro_batch_counter", "python_rng", "numpy_rng", "torch_rng",
                     "tf_rng", "loader_worker_seeds", STEP_COUNTER)
# a Keras learning-rate schedule is a function of optimizer.iterations: its value differs when they do


def _accumulation_views(k: int, micro: int, got: dict[str, Any], update: dict[str, Any] | None,
                        reference: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Mid-accumulation: what the resumed launch is compared with, and what it showed. The state at its first
    backward pass is compared with the uninterrupted run's before backward ``micro + 1`` of update ``k + 1``
    (a resume that restored the partial gradient and the micro-batch counter), or, when that fits fewer
    components, before backward 1 (a resume from the last update that redoes the whole accumulation step:
    also faithful). ``data`` is the gradient of update ``k + 1``; ``micro_batch_counter`` the backward passes
    the resumed launch made before it."""
    mid: dict[str, Any] = next((r["components"] for r in reference if r.get("state") == k), {})
    boundary = next((r["components"] for r in reference if r.get("boundary") == k), None)
    ref_update = next((r for r in reference if r.get("update_after") == k), {})
    total = ref_update.get("micro_batches")
    shown = dict(got, data=(update or {}).get("data"), micro_batch_counter=(update or {}).get("micro_batches"))
    want = dict(mid, data=ref_update.get("data"), micro_batch_counter=None if total is None else total - micro)
    if boundary is not None:
        from_update = dict(boundary, data=ref_update.get("data"), micro_batch_counter=total)
        if sum(from_update.get(c) != shown.get(c) for c in COMPONENTS) < sum(want.get(c) != shown.get(c)
                                                                             for c in COMPONENTS):
            want = from_update
    return want, shown


def judge(reference: list[dict[str, Any]], launches: list[dict[str, Any]], at: list[int],
          micro: int | None = None) -> dict[str, Any]:
    """The resume check's record from the launches' records.

    ``reference``: the reference launch's records (``{"state": k, "components": {...}}`` per resume
    point, ``{"steps": n, "final_parameters": d}`` at its end). ``launches``: per interrupted or resumed
    launch ``{"rc": int, "records": [...], "tail": str}``, in order. The verdict is ``identical`` (every
    component at every resume point, the update count and the final parameters bitwise equal),
    ``not_restored`` (``missing`` names the pieces, in :data:`COMPONENTS` order) or ``failed`` (a launch
    could not run: ``reason`` says which and why). ``micro``: the launches were stopped after that many
    backward passes of the update after each resume point (:func:`_accumulation_views`)."""
    ref_states = {r["state"]: r["components"] for r in reference if "state" in r}
    ref_end = next((r for r in reference if "steps" in r), None)
    record: dict[str, Any] = {"at": list(at), "points": [], "missing": [], "verdict": "identical", "reason": ""}
    if ref_end is None:
        return dict(record, verdict="failed", reason="the uninterrupted run did not finish")
    if not ref_states and ref_end["steps"] == 0:
        return dict(record, verdict="failed", reason="the code made no optimizer step that the check could see "
                    "(the check counts torch optimizer steps and Keras optimizer applies)")
    short = [k for k in at if k not in ref_states]
    if short and micro and all(k < ref_end["steps"] for k in short):
        return dict(record, verdict="failed", reason=f"the update after step(s) {short} had fewer than "
                    f"{micro + 1} backward passes: no stop after {micro} micro-batch(es) there")
    if short:
        return dict(record, verdict="failed", reason=f"the uninterrupted run made {ref_end['steps']} updates, "
                    f"not more than the resume step(s) {short}")
    resumed_steps = 0
    for i, launch in enumerate(launches):
        records = launch["records"]
        interrupted = i < len(at)
        if interrupted and not any("killed_after" in r for r in records):
            return dict(record, verdict="failed", reason=f"launch {i + 1} was to be killed after update {at[i]} but "
                        f"ended first (exit status {launch['rc']}): {launch.get('tail', '')[-300:]}")
        if interrupted:
            resumed_steps += at[i] - (at[i - 1] if i else 0)
        else:
            end = next((r for r in records if "steps" in r), None)
            if end is None or launch["rc"] != 0:
                return dict(record, verdict="failed", reason=f"the resumed launch (after update {at[-1]}) failed "
                            f"(exit status {launch['rc']}): {launch.get('tail', '')[-300:]}")
            resumed_steps += end["steps"]
        if i == 0:
            continue
        state = next((r for r in records if "state" in r), None)
        point: dict[str, Any] = {"step": at[i - 1], "differ": []}
        if state is None:
            point["differ"] = ["parameters"]
            point["note"] = "the resumed launch made no update"
        else:
            want, got = ref_states[at[i - 1]], state["components"]
            if micro:
                update = next((r for r in records if "update_after" in r), None)
                want, got = _accumulation_views(at[i - 1], micro, got, update, reference)
                point["micro_batches"] = micro
            point["differ"] = [c for c in COMPONENTS if want.get(c) != got.get(c)]
            start = ref_states.get(0)
            if start is not None and point["differ"] and all(
                    got.get(c) == start.get(c) for c in ("parameters", "optimizer_state")):
                point["from_scratch"] = True
        record["points"].append(point)
    record["steps"] = {"reference": ref_end["steps"], "resumed": resumed_steps}
    final: dict[str, Any] = next((r for r in launches[-1]["records"] if "steps" in r), {}) if launches else {}
    record["final_identical"] = final.get("final_parameters") == ref_end.get("final_parameters")
    # the first resume point that differs: a piece missed there changes everything after it (a wrong
    # optimizer state at the first point makes the parameters differ at the second)
    first = next((p for p in record["points"] if p["differ"]), None)
    if first is not None and first.get("from_scratch"):
        record.update(verdict="not_restored", missing=[NO_CHECKPOINT],
                      reason=f"not restored: {LABELS[NO_CHECKPOINT]} (resume after update {first['step']})")
        return record
    differ: set[str] = set(first["differ"] if first is not None else [])
    if resumed_steps != ref_end["steps"]:
        differ.add(STEP_COUNTER)
    if "data" in differ and differ & set(_UPSTREAM_OF_DATA):
        differ.discard("data")  # explained by a piece upstream of the batch
    if "optimizer_iterations" in differ:
        differ.discard("lr_scheduler")  # a schedule's learning rate, computed from the iterations
    missing = [c for c in (*COMPONENTS, STEP_COUNTER) if c in differ]
    if not missing and not record["final_identical"]:
        record["reason"] = ("every piece of state matched at the resume point(s) but the final parameters differ: "
                            "state the check does not see (a custom RNG, an iterator of your own) or a "
                            "nondeterministic kernel")
        missing = ["unseen"]
    record["missing"] = missing
    if missing:
        record["verdict"] = "not_restored"
        if not record["reason"]:
            record["reason"] = "not restored: " + "; ".join(LABELS[c] for c in missing)
    return record
