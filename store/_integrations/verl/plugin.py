"""The ``verl.plugins`` entry point: importing this module installs the integration."""

from tracklake._integrations.verl.install import install

install()
