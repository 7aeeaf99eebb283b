"""The exceptions nano raises for bad input and misuse, each a single line naming the fix."""


class NanoConfigError(ValueError):
    """A config, argument or usage problem; the message names the field and the fix in one line."""


class EngineUsageError(AssertionError):
    """An engine call in the wrong place (step() inside no_sync(), no_sync() at stage 2). Official
    DeepSpeed signals these with `assert`, so code written for it catches AssertionError; this
    is one, with DeepSpeed's wording."""


class CheckpointError(NanoConfigError):
    """A checkpoint that cannot be loaded (a missing, truncated or corrupt file, a missing tag,
    shapes that differ from the model's, a stage or precision that cannot be converted); the
    message names the problem and the fix in one line."""
