"""What a GPU rank reserves: CUDA's caching allocator's rules, and what it keeps cached beside a step's peak."""
