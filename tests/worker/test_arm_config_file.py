"""An arm's config file reaches the run: written in the run's directory, its path in
STEADY_CONFIG_FILE and in params['config_file']."""

from __future__ import annotations

import textwrap

from steady.worker.agent.local import run_local


def test_config_file_is_written_for_the_run(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""
        import os
        from steady import sdk
        config = os.environ["STEADY_CONFIG_FILE"]
        assert sdk.params()["config_file"] == config, (sdk.params(), config)
        lr = float(open(config).read().split(":")[1])
        sdk.log(step=0, loss=lr)
    """))
    r = run_local({"framework": "python", "entrypoint": str(path), "seed": 0, "determinism": "seeded",
                   "time_limit_s": 60, "config_file": {"name": "arm.yaml", "content": "lr: 0.25\n"}},
                  work_dir=str(tmp_path / "run"))
    assert r.ok, r.stderr_tail
    assert r.series["loss"] == ([0], [0.25])
    assert (tmp_path / "run" / "config" / "arm.yaml").read_text() == "lr: 0.25\n"
