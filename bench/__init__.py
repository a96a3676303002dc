"""Weir's benchmark: raw torch limit, a naive FastAPI baseline and Weir, in one run.

Run it with ``make bench`` or ``python -m bench.run``; see ``bench/README.md``.
"""
