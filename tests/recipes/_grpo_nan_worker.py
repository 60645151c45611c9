"""Run under `torchrun --nproc-per-node 2`: `rmkit grpo ARGS` where rank 1's reward model returns NaN for one
completion, the fault that must stop every rank (not leave rank 0 waiting in a collective)."""

import math
import os
import sys

import torch

from rmkit import cli
from rmkit.env import RewardModelEnvironment

if __name__ == "__main__":
    if os.environ.get("RANK") == "1":
        real_score = RewardModelEnvironment.score
        RewardModelEnvironment.score = lambda self, convs: real_score(self, convs).index_fill(
            0, torch.tensor([1]), math.nan)
    sys.exit(cli.main(sys.argv[1:]))
