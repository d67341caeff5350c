"""Integrations with training frameworks (`tracklake.integrations.verl`)."""
