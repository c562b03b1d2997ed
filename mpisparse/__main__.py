"""``python -m mpisparse``: the same CLI as the ``mpisparse`` command."""

from .cli import main

if __name__ == "__main__":
    main()
