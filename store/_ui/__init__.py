"""`tracklake ui`: a read-only dashboard of the store, served from this machine.

``server`` is the HTTP layer (binding, token, limits, static files); ``answers`` turns a
request into SQL over the store's read-only views; ``series`` is the downsampled curves'
SQL; ``media`` reads histograms and media with the report's code and decides which blob
may be sent, and how; ``traces`` reads trace trees (the report's code) and events;
``shown`` is what a panel ran, as the page shows it; ``offline`` writes the page as one
file with those answers embedded (`tracklake report`); ``static/`` holds the page and
the vendored uPlot with its licence.
"""

from tracklake._ui.server import Dashboard

__all__ = ["Dashboard"]
