"""What a rank does about faults: named pauses, restarts, and an out-of-memory told in one line."""
