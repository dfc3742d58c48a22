"""`remat run`: trains a demo under a schedule and reports exactness and measured memory."""

from __future__ import annotations

from executor.cli import main


def test_remat_run_demo_gpt_is_bit_identical_and_within_allowance(capsys):
    status = main(
        ["run", "--demo", "gpt", "--budget", "100%", "--steps", "3", "--time-limit", "10"]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "bit-identical to eager on every step (loss, grads, params): yes" in out
    assert "within allowance: yes" in out
    assert "checkpoint sqrt(n)" in out


def test_remat_run_refuses_an_unknown_demo(capsys):
    assert main(["run", "--demo", "nope"]) == 2
    assert "unknown demo model 'nope'" in capsys.readouterr().err


def test_remat_run_with_a_schedule_file_solved_offline(tmp_path, capsys):
    path = tmp_path / "gpt.json"
    assert (
        main(
            [
                "solve",
                "--demo",
                "gpt",
                "--budget",
                "100%",
                "--no-baselines",
                "--quiet",
                "--time-limit",
                "10",
                "--out",
                str(path),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["run", "--demo", "gpt", "--schedule", str(path), "--steps", "2"]) == 0
    assert (
        "bit-identical to eager on every step (loss, grads, params): yes" in capsys.readouterr().out
    )
