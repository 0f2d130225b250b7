import torch

# One CPU thread: step times do not depend on the runner's core count.
torch.set_num_threads(1)
