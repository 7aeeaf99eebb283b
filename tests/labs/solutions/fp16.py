"""The reference solution of lab fp16 (kept in the tests, not in the package a learner gets)."""

LAB = "fp16"
STAGE = 2
ON_NANO = True


def update_scale(scaler, overflow):
    if overflow:
        if scaler.delayed_shift == 1 or scaler.cur_hysteresis == 1:
            if scaler.cur_scale == scaler.min_scale:
                raise RuntimeError("fp16 loss scale is already at min_loss_scale and gradients still overflow")
            scaler.cur_scale = max(scaler.cur_scale / scaler.scale_factor, scaler.min_scale)
        else:
            scaler.cur_hysteresis -= 1
        scaler.last_overflow_iter = scaler.cur_iter
    else:
        if scaler.consecutive_hysteresis:
            scaler.cur_hysteresis = scaler.delayed_shift
        stable_interval = (scaler.cur_iter - scaler.last_overflow_iter) - 1
        if stable_interval > 0 and stable_interval % scaler.scale_window == 0:
            if not scaler.consecutive_hysteresis:
                scaler.cur_hysteresis = scaler.delayed_shift
            scaler.cur_scale *= scaler.scale_factor
    scaler.cur_iter += 1
