"""Which engine a run uses: nano, official DeepSpeed (and what it needs around its import), FSDP2, the user's own."""
