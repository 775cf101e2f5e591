"""What ``steady compare`` names as differing between two studies (``steady.server.reports.differences``):
pure, from specs, fingerprints and per-file digests."""

from __future__ import annotations

from steady.server.reports.differences import (
    CodeFiles,
    StudySide,
    argv_parts,
    command_differences,
    differences,
    is_spec_text,
    stack_differences,
)

SPEC = {"workload": {"framework": "torch", "command": ["python", "train.py", "--seed", "{seed}", "--lr", "0.05"]},
        "determinism": ["seeded"], "seeds": [0, 1], "repeats": 1, "threads": 2}


def _notes(diffs) -> list[str]:
    return [d.note for d in diffs]


def test_argv_options_with_values_flags_equals_and_negative_numbers():
    assert argv_parts(["python", "t.py", "--lr=0.1", "-v", "--shift", "-1", "--tag", "a", "--tag", "b"]) == (
        ["python", "t.py"], {"--lr": "0.1", "-v": None, "--shift": "-1", "--tag": "a b"})


def test_command_differences_token_by_token():
    a = ["python", "train.py", "--seed", "{seed}", "--lr", "0.05", "--fast"]
    b = ["python", "train2.py", "--lr=0.1", "--seed", "{seed}", "--epochs", "3"]
    assert _notes(command_differences(a, b)) == [
        "argument 2: train.py → train2.py", "--lr: 0.05 → 0.1", "--fast: (flag) → unset", "--epochs: unset → 3"]
    assert command_differences(a, list(a)) == []


def test_params_workload_determinism_and_settings():
    other = {**SPEC, "workload": {"framework": "torch", "entrypoint": "train.py:main", "params": {"opt": {"lr": 0.1}}},
             "determinism": ["seeded", "strict"], "seeds": [0, 1, 2]}
    assert _notes(differences(StudySide(SPEC), StudySide(other))) == [
        "workload: command → entrypoint train.py:main", "params.opt.lr: unset → 0.1",
        "determinism levels: seeded → seeded, strict", "seeds: [0, 1] → [0, 1, 2]"]


def test_code_files_by_digest_and_a_spec_file_is_not_code():
    a = CodeFiles("a" * 64, {"train.py": "1" * 64, "model.py": "2" * 64, "study.yaml": "3" * 64}, frozenset({"study.yaml"}))
    b = CodeFiles("b" * 64, {"train.py": "1" * 64, "model.py": "4" * 64, "study.yaml": "5" * 64, "new.py": "6" * 64},
                  frozenset({"study.yaml"}))
    diffs = differences(StudySide(SPEC, code=a), StudySide(SPEC, code=b))
    assert [(d.kind, d.name) for d in diffs] == [("code", "model.py"), ("code", "new.py"), ("spec_file", "study.yaml")]
    assert diffs[1].note == f"code new.py: unset → sha256:{'6' * 12}"
    unreadable = differences(StudySide(SPEC, code=a), StudySide(SPEC, code=CodeFiles("b" * 64, problem="gone")))
    assert [d.name for d in unreadable] == ["archive (files not compared: gone)"]
    assert differences(StudySide(SPEC, code=a), StudySide(SPEC, code=a)) == []


def test_is_spec_text():
    assert is_spec_text("study.yaml", b"name: x\nworkload: {framework: torch, command: [python, t.py]}\n")
    assert not is_spec_text("config.yaml", b"lr: 0.1\n") and not is_spec_text("data.json", b"[1, 2")
    assert not is_spec_text("a.yaml", b"{{{")


def test_stack_fields_that_differ_and_not_the_determinism_environment():
    a = [{"numpy_version": "1.26.4", "threads": {"OMP_NUM_THREADS": "1"}, "env": {"PYTHONHASHSEED": "0"}}]
    b = [{"numpy_version": "2.0.0", "threads": {"OMP_NUM_THREADS": "2"}, "env": {"PYTHONHASHSEED": "7"}},
         {"numpy_version": "2.0.0", "threads": {"OMP_NUM_THREADS": "2"}, "env": {"PYTHONHASHSEED": "8"}}]
    assert _notes(stack_differences(a, b)) == ["stack numpy_version: 1.26.4 → 2.0.0",
                                               "stack threads.OMP_NUM_THREADS: 1 → 2"]
    assert stack_differences(a, []) == []  # a study without runs has no stack to compare


def test_arms_by_name_their_params_and_config():
    arms = [{"name": "old", "params": {"lr": 0.1}}, {"name": "new", "params": {"lr": 0.2}}]
    other = [{"name": "old", "params": {"lr": 0.1}},
             {"name": "new", "params": {"lr": 0.3}, "config": {"name": "c.yaml", "content": "x: 1\n"}},
             {"name": "third"}]
    notes = _notes(differences(StudySide({**SPEC, "arms": arms}), StudySide({**SPEC, "arms": other})))
    assert notes[:2] == ["arms.new.params.lr: 0.2 → 0.3", "arms.new.config: unset → c.yaml sha256:" + notes[1][-12:]]
    assert notes[2:] == ["arm third: unset → present"]
