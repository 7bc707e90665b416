"""Plain-torch modules for the export_model fixtures: importable by torch 1.13 (CI's oracle test,
tests/oracle/export_model_vs_torch.py, builds them there) and torch 2.9+ (make_fixtures.py
exports them). No op here needs more than opset 17's forms after pipetrain's adaptation.
"""
import torch
import torch.nn as nn

# name: (class, example input shape); inputs are float32, dim 0 the batch
SHAPES = {"convbn": (2, 3, 8, 8), "block": (2, 4, 8)}


class ConvBn(nn.Module):
    """Conv-BatchNorm-ReLU twice, then a Linear head: [B, 3, 8, 8] -> [B, 5]."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)  # bias=False exports a CastLike
        self.bn2 = nn.BatchNorm2d(8, momentum=0.2)
        self.head = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(torch.flatten(x, 1))


class Block(nn.Module):
    """A pre-LN transformer block (2 heads) and a Linear head: [B, 4, 8] -> [B, 5]."""

    def __init__(self, d=8, heads=2, seq=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.head = nn.Linear(seq * d, 5)

    def forward(self, x):
        b, t, d = x.shape
        h = d // self.heads
        qkv = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        a = torch.softmax(q @ k.transpose(-1, -2) / h ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))
        return self.head(torch.flatten(x, 1))


MODULES = {"convbn": ConvBn, "block": Block}
