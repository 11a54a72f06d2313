"""A source folder, not a package: it holds the namespace portion aligner.coordinator."""

raise ImportError(f"{__name__}/ is a source folder, not a package: import aligner.coordinator (make setup installs it)")
