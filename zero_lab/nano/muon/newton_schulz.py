"""Muon's update of one whole matrix: momentum, Nesterov blend, Newton-Schulz orthogonalisation.

This is the only place nano's Muon arithmetic lives. It follows official DeepSpeed 0.19.8's
`muon_update` operation for operation (the same coefficients, five steps, the same order of
additions and products), so nano and official agree bit for bit on the same gradient in fp32.

Phase 1 (momentum): momentum <- lerp(momentum, gradient, 1 - beta), kept as it was when the
         gradient holds a non-finite value (a step the loss scaler will skip must not poison it).
Phase 2 (Nesterov): the update is lerp(gradient, momentum, beta), written into the gradient.
Phase 3 (orthogonalise): the update divided by its Frobenius norm, then five Newton-Schulz
         iterations X <- aX + (bA + cA^2)X with A = XX^T and (a, b, c) = (3.4445, -4.7750, 2.0315):
         every singular value is pushed towards 1 (between about 0.7 and 1.2, not exactly 1).
         "gram" (official's default) iterates on the small Gram matrix XX^T of a wide matrix and
         restarts at step 2; "standard" iterates on X itself, in bf16 on CPU as official does.
Phase 4 (scale): times sqrt(rows / cols) when the matrix is taller than wide.
Every phase reads the whole matrix: that is why ZeRO must hand Muon whole matrices.
"""

from __future__ import annotations

import math

import torch

COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic's (a, b, c), Keller Jordan's
STEPS = 5
NORM_EPSILON = 1e-7
RESTART_AT = 2  # gram: the step at which the iteration is re-anchored on X
METHODS = ("gram", "standard")


def compute_dtype(method: str, device: torch.device) -> torch.dtype:
    """The dtype the iteration runs in, as official chooses it: gram in fp16 and standard in bf16
    where the device supports them, else fp32 (a CPU: fp16 matmuls only where oneDNN has them)."""
    if device.type == "cuda":
        return torch.float16 if method == "gram" else torch.bfloat16
    if method == "gram":
        return torch.float16 if torch.ops.mkldnn._is_mkldnn_fp16_supported() else torch.float32
    return torch.bfloat16


def _iterate_standard(x: torch.Tensor, steps: int) -> torch.Tensor:
    a, b, c = COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT
        polynomial = b * gram + c * gram @ gram
        x = a * x + polynomial @ x
    return x


def _iterate_gram(x: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Iterate on R = XX^T (rows x rows); returns X and the accumulated polynomial Q, whose product
    QX is the result (taken by the caller in the orientation official takes it)."""
    a, b, c = COEFFICIENTS
    gram, accumulated = x @ x.mT, None
    for step in range(steps):
        if step == RESTART_AT:
            x = accumulated @ x
            gram, accumulated = x @ x.mT, None
        polynomial = b * gram + c * gram @ gram
        if accumulated is None:
            accumulated = polynomial.clone()
            accumulated.diagonal().add_(a)
        else:
            accumulated = a * accumulated + polynomial @ accumulated
        if step < steps - 1 and step + 1 != RESTART_AT:
            half = a * gram + polynomial @ gram
            gram = a * half + polynomial @ half
    return x, accumulated


def orthogonalise(matrix: torch.Tensor, method: str = "gram", steps: int = STEPS) -> torch.Tensor:
    """Phase 3: Newton-Schulz on a 2-D matrix; returns a new tensor in the iteration's dtype."""
    dtype = compute_dtype(method, matrix.device)
    tall = matrix.size(-2) > matrix.size(-1)
    if method == "standard":
        x = matrix.to(dtype)
        x = x.mT if tall else x
        x = _iterate_standard(x / (x.norm(dim=(-2, -1), keepdim=True) + NORM_EPSILON), steps)
        return x.mT if tall else x
    x = matrix.to(torch.float32 if matrix.dtype == torch.float16 else matrix.dtype)  # normalise where fp16 cannot overflow
    x = x.mT if tall else x
    x = (x / (x.norm(dim=(-2, -1), keepdim=True) + NORM_EPSILON)).to(dtype)
    if x.size(-1) <= x.size(-2):  # square: the Gram matrix saves nothing
        x = _iterate_standard(x, steps)
        return x.mT if tall else x
    x, accumulated = _iterate_gram(x, steps)
    return x.mT @ accumulated.mT if tall else accumulated @ x


def aspect_scale(rows: int, cols: int) -> float:
    """Phase 4: sqrt(rows / cols) for a tall matrix, 1 otherwise."""
    return math.sqrt(rows / cols) if rows > cols else 1.0


@torch.no_grad()
def muon_update(gradient: torch.Tensor, momentum: torch.Tensor, beta: float, method: str = "gram") -> torch.Tensor:
    """Phases 1-4 for one whole matrix; `momentum` is updated in place and `gradient` overwritten
    with the Nesterov blend. Returns the update, in the gradient's dtype."""
    finite = torch.isfinite(gradient).all()
    momentum.copy_(torch.where(finite, momentum.lerp(gradient, 1 - beta), momentum))  # Phase 1
    blend = gradient.lerp_(momentum, beta)  # Phase 2
    update = orthogonalise(blend, method)  # Phase 3
    update *= aspect_scale(gradient.size(-2), gradient.size(-1))  # Phase 4
    update = update.to(gradient.dtype)
    return torch.where(finite, update, gradient)  # a non-finite gradient stays visible to the norm
