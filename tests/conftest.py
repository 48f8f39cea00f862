import os

import pytest
import torch

# Two cores on CI: keep torch from oversubscribing them with the optimizer thread.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
