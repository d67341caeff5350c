"""Integrations with training frameworks: each one makes tracklake a backend of the
framework's own logging, loaded through the framework's plug-in mechanism."""
