from jobq.ops.cli import main

main()
