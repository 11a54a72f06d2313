"""A source folder, not a package: it holds the namespace portion aligner.connectors."""

raise ImportError(f"{__name__}/ is a source folder, not a package: import aligner.connectors (make setup installs it)")
