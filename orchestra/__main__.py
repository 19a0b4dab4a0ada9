"""`python -m orchestra`: the same entry point as the `orchestra` command."""

from orchestra.cli import main

if __name__ == "__main__":
    main()
