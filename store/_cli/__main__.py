"""`python -m tracklake._cli`: the command line."""

from tracklake._cli.main import run

run()
