"""tracklake.exporters: processes that tail the store and replay it into other tools."""

__all__: list[str] = []
