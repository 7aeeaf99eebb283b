"""How fast a run trained: step times with their noise (`step_times`), tokens/s, TFLOP/s and MFU
(`throughput`), and the phases of its last step (`step_phases`)."""
