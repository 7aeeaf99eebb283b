"""fp16 loss scaling with DeepSpeed's semantics (static, or dynamic with hysteresis).

Dynamic scaling, per optimizer step:
    overflow: if hysteresis is used up, halve the scale (never below min_loss_scale, and an overflow
              at the minimum is an error, as in DeepSpeed); else spend one unit of hysteresis.
    no overflow: every `loss_scale_window` overflow-free steps after the last overflow, double the scale and
              refill hysteresis (`consecutive_hysteresis` refills it after every good step).
"""

from __future__ import annotations

from zero_lab.nano.config import Fp16Config


class LossScaler:
    """The current loss scale and its update rule; a scale of 1 that never moves when disabled."""

    def __init__(self, config: Fp16Config):
        self.dynamic = config.enabled and config.loss_scale == 0
        self.cur_scale = float(2 ** config.initial_scale_power if self.dynamic else
                               (config.loss_scale if config.enabled else 1.0))
        self.scale_factor = 2.0
        self.scale_window = config.loss_scale_window
        self.min_scale = config.min_loss_scale
        self.delayed_shift = config.hysteresis
        self.cur_hysteresis = config.hysteresis
        self.consecutive_hysteresis = config.consecutive_hysteresis
        self.cur_iter = 0
        self.last_overflow_iter = -1

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update_scale(self, overflow: bool) -> None:
        if not self.dynamic:
            return
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale:
                    raise RuntimeError("fp16 loss scale is already at min_loss_scale and gradients still overflow; "
                                       "lower the learning rate or use bf16")
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if stable_interval > 0 and stable_interval % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1
