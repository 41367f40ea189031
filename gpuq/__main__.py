"""``python -m gpuq``: the same as the ``gpuq`` console script (see :mod:`gpuq.cli`)."""

if __name__ == "__main__":
    import sys

    from .cli import main

    sys.exit(main())
