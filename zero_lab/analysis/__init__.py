"""Pure functions behind the CLI: log parsing, metrics, deltas and verdicts, reports, plots,
estimates, torchrun commands and the run-directory layout. Nothing here starts a process."""
