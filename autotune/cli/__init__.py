"""The command line, argparse only: one module per subcommand, the shared study arguments and
the stop signals once (`common`). Each handler turns its arguments into values and calls the
subsystem that does the work; nothing imports `autotune.cli`.
"""
