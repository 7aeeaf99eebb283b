"""Why the parity tolerances hold on any CPU's kernels: the error bounds they are derived from.

Terms first. A *parity test* trains the same model twice, nano against a single-process torch
reference (or against official DeepSpeed), and compares the parameters after every step. Both run
in float32, whose *unit roundoff* u = 2**-24 (about 6e-8) is the largest relative error of one
rounding. The two runs add the same numbers in other orders: ranks sum a gradient across the
world where the reference sums one global batch, and torch's kernels differ by CPU (the
ATEN_CPU_CAPABILITY levels default, avx2 and avx512 use other vector widths, so other orders).
Reordering a sum of terms no larger than T changes it by a few u x T.

How a gradient's rounding becomes a parameter's error:
    1. Gradients. The test models' per-token gradient terms are below 1e-2, so two orders of
       the same sum differ by at most GRADIENT_ROUNDING = 1e-9 (16 u x 1e-2; measured 2e-10).
    2. Adam's step is lr * m / (sqrt(v) + eps). On the first step m / sqrt(v) = g / |g|, and
       d/dg [g / (|g| + eps)] = eps / (|g| + eps)**2, largest at g = 0, where it is 1 / eps. A
       gradient element that is near zero because its terms cancel moves its parameter by up
       to lr * GRADIENT_ROUNDING / eps more or less: with torch's default eps of 1e-8 and lr
       1e-2 that is 1e-3, and a tolerance of 1e-5 held or failed by the CPU (measured: one
       element of a tiny Qwen3 at 3 ranks, gradient -3.4e-8, off by 1.01e-5 on avx512).
       So parity tests set Adam's eps to ADAM_EPS = 1e-5: the bound per step becomes 1e-6.
       Gradients far above eps (nearly all of them) still take Adam's normalised step of
       about lr, so every step is a real update a thousand times larger than the tolerance.
    3. Muon's half orthogonalises the momentum with five Newton-Schulz iterations, whose
       polynomial's slope at zero is 3.4445: a direction with a small singular value grows by
       at most NEWTON_SCHULZ_GAIN = 3.4445**5 (about 490). Its input, the momentum over its
       norm, carries a relative rounding of MOMENTUM_ROUNDING = 1e-7 (GRADIENT_ROUNDING over
       the test matrices' gradient norms, above 1e-2), so a step is off by at most
       muon_lr x 490 x 1e-7.
    4. Steps add: a bound per step times the steps compared, plus the rounding of the
       parameters themselves (values below 1: a few u per step).
    5. Two engines that add the clip's sum of squares in other groupings get norms, and so clip
       coefficients, a relative CLIP_NORM_ROUNDING = 1e-6 apart (float32 sums of up to 1e4
       squares, pairwise); every update is scaled by that much more or less, which changes the
       loss by at most that fraction of what the updates changed it, below the loss itself.

Every tolerance built here is a bound of that kind, not a measurement with a margin: a change of
kernels moves the measured error, never past the bound.
"""

from __future__ import annotations

UNIT_ROUNDOFF = 2.0 ** -24
GRADIENT_ROUNDING = 1e-9  # 1: two orders of a sum of terms below 1e-2
ADAM_EPS = 1e-5  # 2: the parity tests' Adam eps, which bounds the step's sensitivity to rounding by lr / eps
NEWTON_SCHULZ_GAIN = 3.4445 ** 5  # 3: the largest growth of five quintic iterations (slope at zero)
MOMENTUM_ROUNDING = 1e-7  # 3: GRADIENT_ROUNDING relative to the test matrices' gradient norms (> 1e-2)
PARAMETER_ROUNDING = 4 * UNIT_ROUNDOFF  # 4: a step's own roundings of a parameter below 1
CLIP_NORM_ROUNDING = 1e-6  # 5: the relative gap of one norm summed in two groupings


def adam_parity_bound(lr: float, steps: int, eps: float = ADAM_EPS) -> float:
    """The largest parameter difference `steps` AdamW steps can build from gradient rounding alone."""
    return steps * (lr * GRADIENT_ROUNDING / eps + PARAMETER_ROUNDING)


def muon_parity_bound(muon_lr: float, adam_lr: float, steps: int) -> float:
    """The same for Muon with its auxiliary AdamW: a parameter is in one half, so the larger bound."""
    muon = steps * (muon_lr * NEWTON_SCHULZ_GAIN * MOMENTUM_ROUNDING + PARAMETER_ROUNDING)
    return max(muon, adam_parity_bound(adam_lr, steps))


def clipped_loss_bound(loss: float, steps: int) -> float:
    """5: how far a loss can move when every update of `steps` steps is scaled by a clip
    coefficient CLIP_NORM_ROUNDING off."""
    return steps * CLIP_NORM_ROUNDING * abs(loss)
