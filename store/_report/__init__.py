"""Pictures of runs: line charts in the terminal (`tracklake plot`, `watch --plot`) and a
self-contained HTML or Markdown report (`tracklake report`). A reader-side layer: it reads
the store only through SQL over the read-only views."""
