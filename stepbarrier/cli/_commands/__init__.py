"""The ``stepbarrier`` subcommands, one module per group."""
