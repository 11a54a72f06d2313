"""``python -m aligner.connectors.runtime``: the older spelling of ``aligner-worker``."""

from aligner.connectors.runtime.worker import main

if __name__ == "__main__":
    main()
