"""Carrying runs across an air gap: pack, the archive and its manifest, unpack."""
