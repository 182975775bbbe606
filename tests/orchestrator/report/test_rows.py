"""The one value and row format of the console and log.txt: floats to 4 significant digits, the rest as str, a
train_df row as ``key=value`` pairs in its column order."""

import math

import numpy as np

from orchestrator.report.rows import format_row, format_value


def test_a_row_is_key_value_pairs_with_floats_to_4_significant_digits():
    row = {"frame": 2048, "epi": 12, "total_reward": 21.333333, "total_reward_ma": math.nan, "fps": 12345.6,
           "lr": 0.00030001, "loss": np.float64(-0.125), "done": True, "name": "ppo"}
    assert format_row(row) == ("frame=2048 epi=12 total_reward=21.33 total_reward_ma=nan fps=1.235e+04 lr=0.0003 "
                               "loss=-0.125 done=True name=ppo")
    assert [format_value(v) for v in (0.95, 1e-05, 3, None, [1, 2])] == ["0.95", "1e-05", "3", "None", "[1, 2]"]
