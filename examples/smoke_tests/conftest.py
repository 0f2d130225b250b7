"""Shared set-up for the smoke tests: one CPU thread, so step times do not depend on the
runner's core count."""

import torch

torch.set_num_threads(1)
