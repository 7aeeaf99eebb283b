"""The one exception type nano raises for bad input, so callers can print it as a single line."""


class NanoConfigError(ValueError):
    """A config, argument or usage problem; the message names the field and the fix in one line."""
