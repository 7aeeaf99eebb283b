"""Pure functions behind the CLI: log parsing, metrics, deltas and verdicts, reports, plots,
estimates and the run-directory layout. Nothing here starts a process (that is zero_lab.launch).

Logs become pandas tables in `tables` (steps, phases, per-run summaries) and comparisons in
`comparison` (deltas, loss gaps); `metrics` holds only the verdict's rules; `frames` is the
notebook API that `zero_lab.load_steps` and its siblings expose. pandas and matplotlib load only
where a command uses them, never at the CLI's start-up."""
