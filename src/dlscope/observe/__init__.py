"""Import paths of earlier releases, kept working by re-export (nothing else lives here): the code
moved to injob/, contract/, supervise/, analysis/ and instruments/ (docs/architecture.md)."""
