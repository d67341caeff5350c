"""What more than one destination uses: routing resumed attempts, nesting keys."""
