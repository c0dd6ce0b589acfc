"""`compare` on hand-made sweep folders with known per-seed scores, in-process: rliable's IQM, intervals and
probability of improvement, the verdict lines, the held policies' scores, curves without survival bias, the keys that
act, the terminal's width and the page in a real browser."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import yaml

from browser import find_chromium, probe_page, run_chromium

from dqn_cartpole.cli import main
from dqn_cartpole.config import load_config, locate_config, to_dict
from dqn_cartpole.experiments import compare, compare_table, stats, verdicts
from dqn_cartpole.report import changed_keys
from dqn_cartpole.run_folder import RunLayout, RunRecord, write_summary
from dqn_cartpole.run_folder.atomic import write_text_atomic
from dqn_cartpole.run_folder.csv_files import CsvLog, read_csv
from dqn_cartpole.run_folder.metrics import EVAL_COLUMNS

DEFAULT_SCORES = [500.0, 498.8, 500.0, 496.0, 470.0]  # the final policies' scores over 100 fresh episodes
RAINBOW_SCORES = [500.0, 500.0, 500.0, 500.0, 499.0]
DEFAULT_STEPS = [8750, 5750, 5500, 7250, 5250]
RAINBOW_STEPS = [5000, 3750, 3750, 4000, 5000]


def make_run(root: str, config: dict, seed: int, evals: list[tuple[int, float]], summary: dict) -> RunLayout:
    """A finished run folder as train writes one: config.yaml, eval_metrics.csv, summary.json (and report.html)."""
    layout = RunLayout(root)
    os.makedirs(root)
    write_text_atomic(layout.config, yaml.safe_dump({**config, "training": {**config["training"], "seed": seed}}))
    log = CsvLog(layout.eval_metrics, EVAL_COLUMNS)
    for step, value in evals:
        log.write({"train_step": step - 1000, "env_steps": step, "average_return": value, "num_episodes": 10})
    log.close()
    write_summary(layout.summary, {"best_return": max(v for _, v in evals), "final_return": evals[-1][1],
                                   "final_policy_return": None, "solve_checked": True, **summary})
    write_text_atomic(layout.report, "<!DOCTYPE html><title>run</title>")
    return layout


def stopped_on_solve(steps: int, score: float) -> dict:
    """summary.json of a run that stopped on its solve: policy/final holds the weights that passed the check, scored
    over its 100 episodes (final_policy_return is null: no fixed-budget score)."""
    return {"solved_at_iteration": steps - 1000, "solved_env_steps": steps, "solved_wall_s": steps / 400,
            "policies": {"final": {"average_return": score, "episodes": 100, "solved": True,
                                   "what": "the weights that passed the solve check (the run stopped on it)"}}}


def config_of(name: str) -> dict:
    return to_dict(load_config(locate_config(name)))


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """default-5 and rainbow-5 as `sweep` lays them out, every run stopped on its solve."""
    tmp_path = tmp_path_factory.mktemp("compare")
    folders = []
    for name, steps, scores in (("default", DEFAULT_STEPS, DEFAULT_SCORES), ("rainbow", RAINBOW_STEPS, RAINBOW_SCORES)):
        config = config_of(name)
        folder = tmp_path / "sweeps" / f"{name}-5"
        for seed, (step, score) in enumerate(zip(steps, scores)):
            evals = [(1000, 20.0), (step - 250, 300.0 + seed), (step, 500.0)]
            make_run(str(folder / f"base__s{seed}"), config, seed, evals, stopped_on_solve(step, score))
        folders.append(str(folder))
    return folders


@pytest.fixture(scope="module")
def compared(sweeps, tmp_path_factory):
    """The two sweeps compared once, for the checks of its numbers and of its page."""
    return compare.compare(compare.load_runs(sweeps), str(tmp_path_factory.mktemp("cmp")))


def test_rliables_iqm_interval_and_probability_of_improvement_and_the_verdict(compared):
    from rliable import library as rly, metrics

    found = compared
    default, rainbow = found.rows
    # IQM of 5: the mean of the middle 3 (a hand computation), its interval rliable's own bootstrap, seeded
    assert default["final policy score (IQM)"].value == pytest.approx((498.8 + 500.0 + 496.0) / 3)
    np.random.seed(stats.SEED)
    _, ci = rly.get_interval_estimates({"d": np.array(DEFAULT_SCORES)[:, None]},
                                       lambda s: np.array([metrics.aggregate_iqm(s)]), reps=stats.REPS)
    estimate = default["final policy score (IQM)"]
    assert (estimate.low, estimate.high) == pytest.approx((ci["d"][0][0], ci["d"][1][0]))
    assert estimate.low < estimate.value <= estimate.high
    # P(a rainbow run scores higher), by hand over the 25 pairs: each of the four 500s beats 498.8, 496 and 470
    # and ties the two 500s (4 x (3 + 2 x 0.5) = 16); 499 beats 498.8, 496 and 470 (3): 19 / 25
    pair = found.verdicts[0]
    score, steps = pair.measures
    assert score.probability.value == pytest.approx(19 / 25)
    assert metrics.probability_of_improvement(np.array(RAINBOW_SCORES)[:, None],
                                              np.array(DEFAULT_SCORES)[:, None]) == pytest.approx(19 / 25)
    np.random.seed(stats.SEED)
    _, ci = rly.get_interval_estimates({"p": [np.array(RAINBOW_SCORES)[:, None], np.array(DEFAULT_SCORES)[:, None]]},
                                       metrics.probability_of_improvement, reps=stats.REPS)
    assert (score.probability.low, score.probability.high) == pytest.approx((ci["p"][0][0], ci["p"][1][0]))
    # every rainbow run solves sooner than every default run: P = 1, its CI [1, 1]: rainbow is better
    assert (steps.probability.value, steps.probability.low, steps.probability.high) == (1.0, 1.0, 1.0)
    assert steps.winner == "rainbow-5" and score.winner is None
    assert pair.line() == (
        f"rainbow-5 vs default-5: final policy score: cannot tell with 5 seeds each (P(rainbow-5 better) = "
        f"0.76 [{score.probability.low:.2f}, {score.probability.high:.2f}]); env steps to solve: rainbow-5 is better "
        f"(P = 1.00 [1.00, 1.00] that its run solves in fewer env steps)")
    assert f"- {pair.line()[:60]}" in found.markdown  # and table.md carries it


def test_the_verdict_names_the_first_group_when_it_is_the_better_and_a_tie_when_every_run_ties():
    def group(label, scores):
        runs = tuple(RunRecord(root=f"/{label}/s{i}", version=1, config={"training": {"seed": i}},
                               summary={"final_policy_return": s, "final_policy_episodes": 100, "solve_checked": False})
                     for i, s in enumerate(scores))
        return compare.Group(label, {}, runs)

    better = verdicts.verdict(group("b", [10.0, 20.0, 30.0]), group("a", [100.0, 200.0, 300.0]), verdicts.MEASURES[0])
    assert better.winner == "a" and better.words() == ("final policy score: a is better (P = 1.00 [1.00, 1.00] that "
                                                       "its run scores higher)")
    tie = verdicts.verdict(group("b", [500.0] * 3), group("a", [500.0] * 2), verdicts.MEASURES[0])
    assert tie.winner is None and "no difference" in tie.words()
    unsure = verdicts.verdict(group("b", [1.0, 3.0]), group("a", [2.0, 4.0, 0.5]), verdicts.MEASURES[0])
    assert "cannot tell with 2 and 3 seeds" in unsure.words()


def test_runs_that_stopped_on_their_solve_show_their_held_policys_score(sweeps, tmp_path):
    found = compare.compare(compare.load_runs(sweeps[:1]), str(tmp_path / "cmp"))
    (row,) = found.rows
    assert row["scored"] == 5 and row["held"] == 5 and row["episodes"] == [100]
    assert row["final policy solves"] == pytest.approx(4 / 5)  # 470 is below CartPole's 475
    assert "One group: no verdict" in compare_table.terminal_report(found.rows, found.groups, found.verdicts)
    cells = compare_table.cells(row)
    assert cells[-2].startswith("498.3 [") and cells[-1] == "4/5 (80%)"
    assert "5 of 5 scored runs stopped on their solve and hold the weights that passed the solve check" in \
        found.markdown
    (csv_row,) = read_csv(str(tmp_path / "cmp" / "table.csv"))
    assert float(csv_row["final policy score (IQM)"]) == pytest.approx((496.0 + 498.8 + 500.0) / 3)
    assert float(csv_row["final policy solves fraction"]) == pytest.approx(0.8)


def test_a_groups_curve_neither_falls_nor_jumps_when_one_of_its_runs_stops(tmp_path):
    """Run a stops on its solve at 3,000 env steps (500); run b goes on at 300 to 6,000. From 3,000 on, the mean
    holds a's 500: (500 + 300) / 2, not b's 300 alone (the runs still going) and no jump at a's stop."""
    config = config_of("default")
    a = make_run(str(tmp_path / "g" / "a"), config, 0, [(1000, 100.0), (2000, 300.0), (3000, 500.0)],
                 stopped_on_solve(3000, 500.0))
    b = make_run(str(tmp_path / "g" / "b"), config, 1, [(1000, 100.0), (2000, 300.0), (4000, 300.0), (6000, 300.0)],
                 {"solved_at_iteration": None, "final_policy_return": 300.0, "final_policy_episodes": 100})
    (group,) = compare.group_runs(compare.load_runs([a.root, b.root]))
    curves = compare.group_curves(group, "mean")
    after = curves.line[curves.x >= 3000]
    assert after == pytest.approx(np.full(after.shape, 400.0))
    assert np.all(np.diff(curves.line[curves.x >= 2000]) >= -1e-9)  # it never falls
    assert curves.low[-1] <= 400.0 <= curves.high[-1]


def test_the_keys_default_and_rainbow_differ_in_are_the_keys_that_act():
    runs = [RunRecord(root=f"/s/{name}/s0", version=1, config=config_of(name)) for name in ("default", "rainbow")]
    differing = compare.differing_keys(runs)
    assert "agent.double_q" not in differing  # C51's own key: the default (Double DQN) does not read it
    assert "network.noisy_sigma0" not in differing  # read only with noisy layers, which the default has off
    assert "agent.double_dqn" not in differing and "agent.solved_target_update_period" not in differing
    assert {"agent.kind", "network.noisy", "agent.learning_rate", "replay.prioritized"} <= set(differing)
    assert changed_keys.show_values([0.0050812235136948915, 0.0048701236328645295]) == ["0.005081", "0.00487"]
    assert changed_keys.show_values([0.00123451, 0.00123459, None, True]) == ["0.0012345", "0.0012346", "null",
                                                                              "true"]
    two_c51 = [RunRecord(root=f"/s/{i}", version=1, config=config_of("rainbow")) for i in range(2)]
    two_c51[1].config["agent"]["double_q"] = False
    assert compare.differing_keys(two_c51) == ["agent.double_q"]  # where both read it, it is a difference


def test_the_run_reports_config_table_lists_only_the_keys_that_act(tmp_path):
    from dqn_cartpole.report.run_page import config_section

    run = RunRecord(root=str(tmp_path / "r"), version=1, config=config_of("default"))
    table = config_section(run)
    listed = re.findall(r'<td class="key">([a-z_]+\.[a-z_0-9]+)</td>', table)
    assert "agent.kind" in listed and "agent.double_dqn" not in listed and "agent.double_q" not in listed
    assert "network.noisy_sigma0" not in listed
    rainbow = re.findall(r'<td class="key">([a-z_]+\.[a-z_0-9]+)</td>',
                         config_section(RunRecord(root=str(tmp_path / "r"), version=1, config=config_of("rainbow"))))
    assert "agent.double_q" in rainbow and "agent.epsilon_start" not in rainbow  # noisy layers explore


def test_the_command_prints_a_table_within_100_columns_the_verdict_and_the_page(sweeps, tmp_path, capsys):
    assert main(["compare", *sweeps, "--output", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines() if not line.startswith("page: ")) <= 100, out
    assert "final policy score (IQM)     498.3 [" in out
    assert "- rainbow-5 vs default-5: final policy score: cannot tell with 5 seeds each" in out
    assert f"page: {tmp_path / 'cmp' / 'report.html'}" in out
    assert sorted(os.listdir(tmp_path / "cmp")) == ["profile.png", "report.html", "returns.png", "solved.png",
                                                    "table.csv", "table.md"]


@pytest.mark.skipif(find_chromium() is None, reason="no chromium or chromium-browser on PATH")
def test_the_compare_page_in_a_browser(compared, tmp_path):
    """No horizontal scroll at 1280 px, every run's link its own label and target, every plot loads, no errors."""
    found = compared
    page = open(found.page, encoding="utf-8").read()
    links = re.findall(r'<a href="([^"]+)">([^<]+)</a>', page)
    assert len(links) == 10 and len({label for _, label in links}) == 10 and len({href for href, _ in links}) == 10
    assert ("default-5, seed 0" in dict((label, h) for h, label in links)
            and "rainbow-5, seed 4" in {label for _, label in links})
    assert "12.484" not in page and "0.0050812235136948915" not in page and "498.3<br>" in page
    assert "rainbow-5 is better" in page  # the verdict, above the table
    browser = find_chromium()
    result = probe_page(browser, found.page, str(tmp_path / "profile"))
    assert [i["naturalWidth"] > 0 for i in result["images"]] == [True] * 3, result["images"]
    assert result["errors"] == [] and result["console"] == [], result
    probe = os.path.join(found.folder, "width.html")
    script = ('<script>window.addEventListener("load", function () { var p = document.createElement("pre"); '
              'p.id = "width"; p.textContent = document.documentElement.scrollWidth + " " + '
              'document.documentElement.clientWidth; document.body.appendChild(p); });</script>')
    write_text_atomic(probe, page.replace("</body>", script + "</body>"))
    dom, _ = run_chromium(browser, ["--window-size=1280,900", "--virtual-time-budget=3000", "--dump-dom",
                                    f"file://{probe}"], str(tmp_path / "profile2"))
    scroll_width, client_width = map(int, re.search(r'<pre id="width">(\d+) (\d+)</pre>', dom).groups())
    assert scroll_width <= client_width, f"the page is {scroll_width} px wide in a {client_width} px window"


def test_the_python_apis_comparison_shows_the_formatted_table_in_jupyter(sweeps, tmp_path):
    """`dq.compare(...)` in a notebook shows the table the page and the terminal show (numbers formatted, CIs
    beside them), not table.csv's raw floats."""
    import dqn_cartpole as dq

    shown = dq.compare(sweeps, output_dir=tmp_path / "api")._repr_html_()
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", shown)
    assert "default-5" in cells and "rainbow-5" in cells and "5,750 [5,250, 8,750]" in cells
    assert not any(re.fullmatch(r"\d+\.\d{5,}", cell) for cell in cells), cells
