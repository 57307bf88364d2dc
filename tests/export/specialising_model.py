"""A user's module that fixes its batch size (``int(x.shape[0])``), for tests/export/test_dynamic_dims.py."""

import torch

import softdeploy.nn


class FixesTheBatch(torch.nn.Module):
    """Reshapes with a Python int taken from a traced size: torch.export specialises the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softdeploy.nn.TwoPassSoftmax()(x.reshape(int(x.shape[0]), -1))
