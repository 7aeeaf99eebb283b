"""Pure functions behind the CLI: log parsing, metrics, deltas and verdicts, reports, plots,
estimates and the run-directory layout. Nothing here starts a process (that is zero_lab.launch)."""
