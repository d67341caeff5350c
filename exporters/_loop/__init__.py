"""The shared export loop: selection, cursors and state, rank modes, status."""
