"""Lab fp16: mixed precision with dynamic loss scaling that skips a step on overflow, as DeepSpeed does.

fp16 holds numbers up to 65,504 and loses gradients below about 6e-8, so the loss is multiplied by a
scale S before backward and the gradients divided by S before Adam. Too large an S overflows: some
gradient becomes inf or nan, and that step must be skipped. nano's engine runs the step (stage 2,
fp16 weights, fp32 master partitions; on_nano.py) and skips an overflowing one; after each step's
overflow check it calls your `update_scale`, which decides the next S.

The scaler's fields (zero_lab/nano/loss_scaler.py reads them; the config's fp16 section sets them):
    scaler.cur_scale            S
    scaler.scale_factor         2: the factor S shrinks or grows by
    scaler.scale_window         loss_scale_window: good steps after an overflow before S grows
    scaler.min_scale            min_loss_scale: S never goes below it
    scaler.delayed_shift        hysteresis: overflows tolerated before S shrinks
    scaler.cur_hysteresis       overflows still tolerated
    scaler.consecutive_hysteresis  refill cur_hysteresis after every good step (else only when S grows)
    scaler.cur_iter             steps so far (count every step, skipped or not)
    scaler.last_overflow_iter   the step of the last overflow (-1: none yet)
"""

LAB = "fp16"
STAGE = 2
ON_NANO = True  # engine.py runs nano's engine with this function (on_nano.py)


def update_scale(scaler, overflow: bool) -> None:
    """DeepSpeed's dynamic loss scaling, after one step:

    overflow:    when no hysteresis is left (delayed_shift == 1 or cur_hysteresis == 1), shrink S by
                 scale_factor, never below min_scale (an overflow at min_scale is an error: raise);
                 else spend one unit of hysteresis. Note the step as last_overflow_iter.
    no overflow: refill cur_hysteresis to delayed_shift when consecutive_hysteresis; once the
                 steps since the last overflow, less one, are a positive multiple of scale_window,
                 grow S by scale_factor (and refill cur_hysteresis if not consecutive_hysteresis).
    Then count the step in cur_iter.
    """
    raise NotImplementedError("lab fp16: write update_scale in lab.py")
