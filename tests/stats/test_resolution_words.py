"""Every compared value carries its resolution, and the words follow it: "bitwise" only where bits or a
digest were compared; values parsed from text are "equal at the N printed decimals"; a missing weight digest
is named with its reason."""
import numpy as np
import pytest

from steady.server.stats.report import MetricSpec, RunData, build_report
from steady.server.stats.resolution import compared, decimals, equal_phrase

NO_OPT = "no torch.optim optimizer stepped and no torch.nn.Module with parameters was found"


def _report(*, printed: float | None, digests: bool, notes: dict | None = None, dtype: str | None = None):
    runs, i = [], 0
    for seed in (1, 2):
        for rep in (0, 1):
            i += 1
            v = np.linspace(2.0, 1.0, 6) + 0.1 * seed
            if printed is not None:
                v = np.round(v, decimals(printed))
            runs.append(RunData(run_id=i, seed=seed, repeat=rep, determinism="seeded", stack="cpu",
                                series={"loss": (np.arange(6), v)},
                                resolutions={"loss": printed} if printed is not None else {},
                                dtypes={"loss": dtype} if dtype else {},
                                digests={"initial_weights": f"i{seed}", "final_weights": f"f{seed}"} if digests else {},
                                digest_notes=notes or {}))
    rep = build_report(runs, [MetricSpec("loss")], rng=np.random.default_rng(0)).to_dict()
    (v,) = [x for x in rep["verdicts"] if x["level"] == "repeatability"]
    assert v["verdict"] == "identical"
    return v


def test_text_at_two_decimals_without_digests_is_never_bitwise():
    v = _report(printed=0.01, digests=False, notes={"initial_weights": NO_OPT, "final_weights": NO_OPT})
    words = " ".join((v["summary"], v["reason"], v["guarantee"], *(s["reason"] for s in v["per_seed"])))
    assert "bitwise" not in words, words
    assert v["summary"].startswith("identical: every repeat equal at the 2 printed decimals (no weight digest: "
                                   + NO_OPT), v["summary"]
    assert "3 significant digits" in v["reason"] and "a difference below 0.01 is not seen" in v["reason"]
    assert "no initial-weight and final-weight digests: " + NO_OPT in v["reason"]
    assert v["guarantee"].startswith("exact at the printed precision only") and "(0.01)" in v["guarantee"]
    assert v["compared"]["basis"] == "printed" and v["compared"]["decimals"] == 2 and v["compared"]["digests"] == []
    assert v["compared"]["missing"] == {"initial_weights": NO_OPT, "final_weights": NO_OPT}


def test_text_with_weight_digests_says_the_weights_were_compared_bitwise():
    v = _report(printed=0.01, digests=True)
    assert "equal at the 2 printed decimals, weights bitwise equal (digests)" in v["summary"]
    assert "the weights bitwise equal (initial-weight and final-weight digests)" in v["reason"]
    assert v["compared"]["digests"] == ["initial_weights", "final_weights"] and v["compared"]["missing"] == {}


def test_binary_values_are_bitwise_in_their_logged_type_and_a_missing_digest_is_named():
    v = _report(printed=None, digests=False, dtype="float32")
    assert v["summary"].startswith("identical: every repeat bitwise equal")
    assert "bitwise identical (float32 values as logged)" in v["reason"]
    assert "no initial-weight and final-weight digests: the run recorded none" in v["reason"]
    assert "float32 values as logged" in v["guarantee"]


@pytest.mark.parametrize("resolution,n", [(0.01, 2), (0.5, 1), (1.0, 0), (1e-6, 6), (0.001, 3)])
def test_decimals_of_a_printed_unit(resolution, n):
    assert decimals(resolution) == n


def test_significant_digits_counted_at_the_printed_unit():
    c = compared([{}, {}], [{}, {}], resolution=0.01, dtype=None, last_values=[2.31, 2.31])
    assert c.significant == 3 and c.decimals == 2
    c = compared([{}, {}], [{}, {}], resolution=0.0001, dtype=None, last_values=[0.0512])
    assert c.significant == 3
    assert "bitwise" not in equal_phrase(c, 2)


def _seeds(*, digests: bool):
    """Two seeds whose printed values agree at two decimals; their weights differ only when ``digests``."""
    v = np.round(np.linspace(2.0, 1.0, 6), 2)
    runs = [RunData(run_id=i + 1, seed=seed, repeat=rep, determinism="seeded", stack="cpu",
                    series={"loss": (np.arange(6), v.copy())}, resolutions={"loss": 0.01},
                    digests={"initial_weights": f"i{seed}", "final_weights": f"f{seed}"} if digests else {})
            for i, (seed, rep) in enumerate(((1, 0), (1, 1), (2, 0), (2, 1)))]
    rep = build_report(runs, [MetricSpec("loss", max_std=1.0)], rng=np.random.default_rng(0)).to_dict()
    (seed_row,) = [x for x in rep["verdicts"] if x["level"] == "seed_stability"]
    (repeat_row,) = [x for x in rep["verdicts"] if x["level"] == "repeatability"]
    return seed_row, repeat_row


def test_seeds_equal_at_two_decimals_whose_weight_digests_differ_are_not_a_seed_without_effect():
    """Two decimals can agree where the weights did not: the digests tell the seeds apart."""
    seed_row, repeat_row = _seeds(digests=True)
    assert seed_row["verdict"] != "seed_has_no_effect" and repeat_row["seeds_identical"] is False
    assert not repeat_row["suspicious"]


def test_seeds_equal_at_two_decimals_without_digests_say_at_which_resolution():
    seed_row, _ = _seeds(digests=False)
    assert seed_row["verdict"] == "seed_has_no_effect"
    assert seed_row["summary"].startswith("the seed has no effect: all 2 seeds gave runs equal at the 2 printed "
                                          "decimals (no weight digest to tell them apart)"), seed_row["summary"]
    assert "bitwise" not in seed_row["summary"] + seed_row["reason"]


def test_the_same_seed_on_two_stacks_equal_at_two_decimals_is_not_bitwise():
    from steady.server.stats.repeatability import RepeatRun
    from steady.server.stats.stack_pairs import stack_pairs

    v = np.round(np.linspace(2.0, 1.0, 6), 2)
    run = RepeatRun(steps=np.arange(6), values=v, resolution=0.01)
    pairs = stack_pairs({1: (run, run), 2: (run, run)})
    assert pairs.verdict == "identical" and pairs.reason == "equal at the 2 printed decimals on both stacks for 2 seed(s)"
    binary = RepeatRun(steps=np.arange(6), values=v)
    assert stack_pairs({1: (binary, binary)}).reason == "bitwise identical on both stacks for 1 seed(s)"


def test_seeds_equal_at_two_decimals_are_noted_at_that_resolution():
    _, repeat_row = _seeds(digests=False)
    assert repeat_row["seeds_identical"] is True
    assert repeat_row["suspicious"] == ["runs of different seeds are equal at the 2 printed decimals (no weight "
                                        "digest to tell them apart): the seed has no effect (the code ignores the seed "
                                        "it is given)"], repeat_row["suspicious"]


NO_ORDER = "TensorFlow's input order is not watched"


def test_a_data_order_digest_is_named_missing_only_where_a_run_said_why():
    """A Keras run has no data-order digest and says why: the reason names it; the weights' words stay theirs."""
    v = _report(printed=0.01, digests=True, notes={"data_order": NO_ORDER})
    assert v["summary"].startswith("identical: every repeat equal at the 2 printed decimals, weights bitwise equal "
                                   "(digests)"), v["summary"]
    assert ("the weights bitwise equal (initial-weight and final-weight digests); no data-order digest: "
            + NO_ORDER) in v["reason"], v["reason"]
    assert v["compared"]["missing"] == {"data_order": NO_ORDER}
    # no weight digests either: the first line gives the weights' own reason, never the data order's
    both = {"initial_weights": NO_OPT, "final_weights": NO_OPT, "data_order": NO_ORDER}
    v = _report(printed=0.01, digests=False, notes=both)
    assert v["summary"].startswith("identical: every repeat equal at the 2 printed decimals (no weight digest: "
                                   + NO_OPT), v["summary"]
    v = _report(printed=0.01, digests=False, notes={"data_order": NO_ORDER})
    assert "(no weight digest recorded)" in v["summary"], v["summary"]
    # a run that said nothing about its data order: none named missing (runs without a data loader)
    assert _report(printed=0.01, digests=True)["compared"]["missing"] == {}


def test_repeats_blamed_on_numerics_without_a_data_order_digest_say_the_order_is_not_ruled_out():
    """Equal initial weights and no data-order digest (a Keras run said why): numerics is the attribution left,
    and the reason says the data order was not compared rather than let it read as ruled out."""
    def runs(notes):
        return [RunData(run_id=rep + 1, seed=1, repeat=rep, determinism="seeded", stack="cpu",
                        series={"loss": (np.arange(4), np.array([2.0, 1.5, 1.2, 1.0 + 0.01 * rep]))},
                        digests={"initial_weights": "i", "final_weights": f"f{rep}"}, digest_notes=notes)
                for rep in (0, 1)]

    def row(notes):
        rep = build_report(runs(notes), [MetricSpec("loss")], rng=np.random.default_rng(0)).to_dict()
        (v,) = [x for x in rep["verdicts"] if x["level"] == "repeatability"]
        return v

    v = row({"data_order": NO_ORDER})
    assert v["verdict"] == "out_of_tolerance" and v["per_seed"][0]["source"] == "numerics", v
    assert v["reason"].endswith("; the data order is not ruled out (no data-order digest: " + NO_ORDER + ")"), v["reason"]
    assert "not ruled out" not in row({})["reason"]  # no run said why it has no order digest: nothing added
