"""Benchmark: the full-size calibration table of every registered decision rule.

Runs every scenario of ``steady.server.stats.calibration.rules.all_rules()`` (healthy, stress and planted)
with ``--sims`` simulated studies each, plus the out-of-band 80%-power offsets for 5/10/20
seeds, and writes ``bench/results/calibration.json`` (with the wall time and the machine).
With ``--update-doc`` it also rewrites the table block of results/calibration.md.

    .venv/bin/python bench/calibration_bench.py [--sims 2000] [--planted-sims 1000] [--update-doc]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from steady.server.stats.calibration import table  # noqa: E402
from steady.server.stats.calibration.rules import all_rules  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--planted-sims", type=int, default=1000)
    ap.add_argument("--power-sims", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=20260101)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "calibration.json"))
    ap.add_argument("--update-doc", action="store_true", help="rewrite the table in results/calibration.md")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    rows = table.run_table(all_rules(), sims=args.sims, planted_sims=args.planted_sims, rng=rng,
                           progress=lambda r: print(f"{r.rule} / {r.scenario}: {r.k}/{r.n}", flush=True))
    power = table.power_offsets(rng=rng, sims=args.power_sims)
    doc = table.to_json(rows, sims=args.sims, planted_sims=args.planted_sims, seed=args.seed,
                        command="python bench/calibration_bench.py " + " ".join(sys.argv[1:]),
                        wall_s=time.perf_counter() - t0,
                        machine={"python": platform.python_version(), "platform": platform.platform()})
    doc["oob_power_offsets"] = power
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    print(table.format_text(rows))
    for p in power:
        print(f"out-of-band, {p['seeds']} seeds: offset {p['offset_level_sd']:.2f} level-sd → power "
              f"{p['power']:.3f} [{p['ci_low']:.3f}, {p['ci_high']:.3f}]")
    if args.update_doc:
        md = REPO / "results" / "calibration.md"
        text = table.update_doc(md.read_text(), table.format_markdown(rows))
        md.write_text(table.update_doc(text, table.format_power_markdown(power), start=table.POWER_START,
                                       end=table.POWER_END))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
