"""The read path: listing and reading runs, SQL views over the store, following a run."""
