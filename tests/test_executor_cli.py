"""`remat run`: trains a demo under a schedule and reports exactness and measured memory."""

from __future__ import annotations

import json

import torch
from torch import nn

from cli.main import main


class TwoOutputs(nn.Module):
    """Not an nn.Sequential; returns a tuple (a tensor and a scalar)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(16, 32), nn.Linear(32, 16), nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.drop(torch.relu(self.a(x)))
        return self.b(h), h.square().mean()


def two_outputs() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A `--model` factory: (model, example_inputs)."""
    torch.manual_seed(0)
    return TwoOutputs().train(), (torch.randn(8, 16),)


def test_remat_run_demo_gpt_is_bit_identical_and_within_the_budget(capsys):
    status = main(
        ["run", "--demo", "gpt", "--budget", "100%", "--steps", "3", "--time-limit", "10"]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "bit-identical to eager on every step (outputs, grads, params): yes" in out
    assert "measured <= budget: yes" in out
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
                "--threads",
                "1",
                "--out",
                str(path),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["run", "--demo", "gpt", "--schedule", str(path), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "bit-identical to eager on every step (outputs, grads, params): yes" in out


def test_remat_run_trains_a_users_model_from_a_factory(capsys):
    """--model MODULE:FACTORY as for profile and solve; a model returning a non-scalar output
    and without an nn.Sequential (no checkpoint row). 300%: the model is so small that the
    executor's own held bytes put its least peak at about twice the plain step (100%)."""
    status = main(
        [
            "run",
            "--model",
            "test_executor_cli:two_outputs",
            "--budget",
            "300%",
            "--steps",
            "2",
            "--time-limit",
            "5",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "remat run: test_executor_cli:two_outputs" in out
    assert "measured <= budget: yes" in out
    assert "bit-identical to eager on every step (outputs, grads, params): yes" in out


def test_remat_run_captures_with_the_thread_count_of_its_schedule(tmp_path, capsys):
    """Solved on a 2-thread capture, the schedule runs with 2 threads when --threads is not
    given; where the graphs differ the error names the thread counts and the flag to pass."""
    path = tmp_path / "two.json"
    factory = "test_executor_cli:two_outputs"
    solve = ["solve", "--model", factory, "--budget", "300%", "--threads", "2"]  # tiny model
    assert main([*solve, "--no-baselines", "--quiet", "--time-limit", "5", "--out", str(path)]) == 0
    capsys.readouterr()
    assert main(["run", "--model", factory, "--schedule", str(path), "--steps", "2"]) == 0
    assert f"schedule {path}, 2 steps, 2 thread(s)" in capsys.readouterr().out

    other = json.loads(path.read_text())
    other["graph_fingerprint"], other["extra"]["threads"] = "0" * 32, 7
    path.write_text(json.dumps(other))
    run = ["run", "--model", factory, "--schedule", str(path), "--steps", "2", "--threads", "1"]
    assert main(run) == 2
    err = capsys.readouterr().err
    assert "solved on a capture with 7 thread(s)" in err and "remat run --threads 7" in err


def test_remat_run_trains_under_an_offload_schedule_and_checks_the_host_peak(tmp_path, capsys):
    """A schedule file with offload ops (a keep-nothing schedule whose recomputes are reloads)
    runs bit for bit, its host pool's peak the predicted one; --offload solves with a link."""
    from test_executor_offload import with_offloads

    from graph_capture import capture
    from solver import Link

    model, inputs = two_outputs()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        schedule = with_offloads(capture(model, inputs), [False], [True], Link(1e9, 1e9))
    finally:
        torch.set_num_threads(before)
    path = tmp_path / "offload.json"
    schedule.save(path)
    factory = ["--model", "test_executor_cli:two_outputs", "--steps", "2"]
    assert main(["run", *factory, "--schedule", str(path)]) == 0
    out = capsys.readouterr().out
    assert "bit-identical to eager on every step (outputs, grads, params): yes" in out
    predicted = f"predicted {schedule.extra['host_peak'] / 2**20:.2f} MiB, equal: yes"
    assert predicted in out and f"({schedule.extra['offloads']} offloads" in out
    solved = ["--budget", "300%", "--offload", "pcie5", "--time-limit", "10"]
    assert main(["run", *factory, *solved]) == 0
    assert "host peak (pool)" in capsys.readouterr().out
    assert main(["run", *factory, "--schedule", str(path), "--offload", "pcie5"]) == 2
    assert "--schedule file has its own link" in capsys.readouterr().err
