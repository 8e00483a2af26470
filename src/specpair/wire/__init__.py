"""The probability wire: frames, byte format (docs/wire.md), transport and client."""
