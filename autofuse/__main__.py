from autofuse.cli import main

main()
