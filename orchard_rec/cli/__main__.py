"""``python -m orchard_rec.cli``: the ``orchard-rec`` command."""

from orchard_rec.cli import main

if __name__ == "__main__":
    main()
