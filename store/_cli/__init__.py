"""The `tracklake` command line: commands, export and pack subcommands, output, demo."""
