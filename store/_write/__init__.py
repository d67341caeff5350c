"""The write path: `Run` → per-rank writer → flush thread → segment files, and what it
captures (identity, coercion, traces, blobs, lifecycle, verl's `Tracking`)."""
