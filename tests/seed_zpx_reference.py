"""Independent transcription of the source design's ZPX layer (docs/design.md §3.6), used only as a test oracle.

Kept literal on purpose: materialised [B, L, L, C] / [B, L, L, C, 3] tensors, eps in the
stereographic denominator, -1e9 masking - exactly as the design document writes it.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def riemann_sphere_projection(x, y, eps=1e-12):
    den = 1.0 + x * x + y * y + eps
    return 2.0 * x / den, 2.0 * y / den, (x * x + y * y - 1.0) / den


class SeedPhaseEncoder(nn.Module):
    def __init__(self, input_dim, phase_channels, max_log_radius=4.0):
        super().__init__()
        self.max_log_radius = max_log_radius
        self.to_log_r = nn.Linear(input_dim, phase_channels)
        self.to_theta = nn.Linear(input_dim, phase_channels)
        self.to_b = nn.Linear(input_dim, phase_channels)

    def forward(self, h):
        log_r = self.max_log_radius * torch.tanh(self.to_log_r(h) / self.max_log_radius)
        theta = math.pi * torch.tanh(self.to_theta(h))
        b = torch.sigmoid(self.to_b(h))
        phase = theta + math.pi * b
        r = torch.exp(log_r)
        x, y = r * torch.cos(phase), r * torch.sin(phase)
        X, Y, Z = riemann_sphere_projection(x, y)
        tensor = torch.stack([log_r, torch.cos(phase), torch.sin(phase), X, Y, Z, b], dim=-1)
        return {"phase": phase, "x": x, "y": y, "sphere": torch.stack([X, Y, Z], dim=-1), "tensor": tensor}


class SeedZPXAngleSphereAttention(nn.Module):
    def __init__(self, input_dim, value_dim, phase_channels, lambda_angle=1.0, lambda_sphere=1.0):
        super().__init__()
        self.q = nn.Linear(input_dim, value_dim)
        self.k = nn.Linear(input_dim, value_dim)
        self.v = nn.Linear(input_dim, value_dim)
        self.phase_encoder = SeedPhaseEncoder(input_dim, phase_channels)
        self.lambda_angle = lambda_angle
        self.lambda_sphere = lambda_sphere

    def forward(self, h, mask=None):
        q, k, v = self.q(h), self.k(h), self.v(h)
        content_score = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        phase = self.phase_encoder(h)
        phi, sphere = phase["phase"], phase["sphere"]
        angle_score = torch.cos(phi[:, :, None, :] - phi[:, None, :, :]).mean(dim=-1)
        sphere_score = (sphere[:, :, None, :, :] * sphere[:, None, :, :, :]).sum(dim=-1).mean(dim=-1)
        score = content_score + self.lambda_angle * angle_score + self.lambda_sphere * sphere_score
        if mask is not None:
            score = score.masked_fill(~mask[:, None, :], -1e9)
        attn = F.softmax(score, dim=-1)
        return torch.matmul(attn, v), attn, phase


def seed_center_cancellation_loss(phase):
    x_sum = phase["x"].sum(dim=1)
    y_sum = phase["y"].sum(dim=1)
    return (x_sum * x_sum + y_sum * y_sum).mean()
