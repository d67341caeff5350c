"""Pictures of runs: line charts in the terminal (`tracklake plot`, `watch --plot`), the
Markdown report (`tracklake report --format md`: content.py reads it, markdown.py writes
it), and the SQL of the report's parts that the dashboard reuses (sections.py). A
reader-side layer: it reads the store only through SQL over the read-only views. (The
HTML report is the dashboard's page: `tracklake._ui.offline`.)"""
