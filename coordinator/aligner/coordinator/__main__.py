from aligner.coordinator.cli import main

main()
