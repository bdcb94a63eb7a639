"""Plain torch models (no espn layers) for the Python API tests, importable by reference
(``helpers.api_models:SmallConvNet(n_classes=3)``) from another process."""

from __future__ import annotations

import torch
from torch import nn


class SmallConvNet(nn.Module):
    """Conv-BN stem, one residual block, global pooling and a linear classifier."""

    def __init__(self, n_classes: int = 3, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width))
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.stem(x))
        h = torch.relu(self.bn1(self.conv1(s)))
        s = torch.relu(s + self.bn2(self.conv2(h)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(s, 1), 1))


class SmallMLP(nn.Module):
    """Flatten, two hidden ReLU layers, a linear classifier."""

    def __init__(self, n_in: int = 64, hidden: int = 32, n_classes: int = 3) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(n_in, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
