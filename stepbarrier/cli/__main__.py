"""``python -m stepbarrier.cli``: the same as the ``stepbarrier`` command."""

from stepbarrier.cli import main

if __name__ == "__main__":
    main()
